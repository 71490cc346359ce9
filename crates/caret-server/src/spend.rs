//! Daily token budgets on the model routes (`/v1/chat/completions`, `/v1/completions`): a
//! person past their budget is refused (429 `budget_exhausted`, until the next UTC day); past
//! 80% of it their answers carry `X-Caret-Budget-Warning`; what each call spent (its usage, as
//! the model reported it) is counted for them, and crossing 80% or 100% is written to the audit
//! trail once. Service accounts and tenant tokens have no budget.

use axum::http::HeaderValue;
use caret_identity::budgets::Crossed;
use caret_models::{Event, EventStream};
use futures::StreamExt as _;

use crate::state::{AppState, Caller};

/// The header that warns a person nearing their budget.
pub const WARNING_HEADER: &str = "x-caret-budget-warning";

/// Whether the caller may call a model now: `Err` with the refusal's message and the seconds
/// until the budget renews; `Ok` with a warning once 80% is spent.
pub async fn check(s: &AppState, caller: &Caller) -> Result<Option<HeaderValue>, (String, u64)> {
    let (Some(identity), Some(user), Some(budget)) = (&s.identity, &caller.principal.user, caller.budget) else {
        return Ok(None);
    };
    // A failing count never blocks a call: the budget is a policy, not a lock.
    let spent = identity.spent_today(&caller.tenant.id, user).await.unwrap_or(0);
    if spent >= budget {
        let renews = caret_identity::budgets::ms_to_next_day(caret_identity::db::now_ms()) / 1000 + 1;
        let why =
            format!("your daily budget of {budget} model tokens is spent ({spent} today); it renews at 00:00 UTC");
        return Err((why, u64::try_from(renews).unwrap_or(86_400)));
    }
    if spent * 5 >= budget * 4 {
        let text = format!("{spent} of today's {budget} model tokens spent");
        return Ok(HeaderValue::from_str(&text).ok());
    }
    Ok(None)
}

/// Counts `tokens` of `model` for the caller's person, in the background.
pub fn record(s: &AppState, caller: &Caller, model: &str, tokens: i64) {
    let (Some(identity), Some(user)) = (s.identity.clone(), caller.principal.user.clone()) else { return };
    let (state, caller, model) = (s.clone(), caller.clone(), model.to_owned());
    tokio::spawn(async move {
        match identity.spend(&caller.tenant.id, &user, &model, tokens, caller.budget).await {
            Ok(Crossed::Nothing) => {}
            Ok(crossed) => {
                let action = if crossed == Crossed::Warning { "budget.warning" } else { "budget.exhausted" };
                let target = format!("{} tokens a day", caller.budget.unwrap_or_default());
                if let Err(e) = state.audit(&caller, action, &target, "ok").await {
                    tracing::warn!(error = %e, "recording a budget crossing");
                }
            }
            Err(e) => tracing::warn!(error = %e, "counting a person's model tokens"),
        }
    });
}

/// `events`, counting the tokens their usage reports for the caller.
pub fn metered(events: EventStream, s: &AppState, caller: &Caller, model: &str) -> EventStream {
    if caller.principal.user.is_none() || s.identity.is_none() {
        return events;
    }
    let (s, caller, model) = (s.clone(), caller.clone(), model.to_owned());
    events
        .inspect(move |e| {
            if let Ok(Event::Usage(u)) = e {
                record(&s, &caller, &model, i64::from(u.prompt_tokens) + i64::from(u.completion_tokens));
            }
        })
        .boxed()
}
