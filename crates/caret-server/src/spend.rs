//! A person's model policy wherever a model is called for them — the model routes, Tab, apply's
//! merges, agent sessions and background runs: the aliases their groups allow (others 403
//! `model_not_allowed`) and their daily token budget. Past the budget a call is refused (429
//! `budget_exhausted`, until the next UTC day); past 80% of it answers carry
//! `X-Caret-Budget-Warning`; what each call spent (its usage, as the model reported it) is
//! counted for them, and crossing 80% or 100% is written to the audit trail once. Service
//! accounts and tenant tokens have neither a model list nor a budget.

use std::sync::Arc;

use axum::http::HeaderValue;
use caret_identity::Identity;
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
    against(identity, &caller.tenant.id, user, budget).await
}

/// [`check`] for `user` of `tenant`, whose budget is `budget`.
async fn against(
    identity: &Identity,
    tenant: &str,
    user: &str,
    budget: i64,
) -> Result<Option<HeaderValue>, (String, u64)> {
    // A failing count never blocks a call: the budget is a policy, not a lock.
    let spent = identity.spent_today(tenant, user).await.unwrap_or(0);
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

/// Whether the caller's groups allow the model `alias`: 403 `model_not_allowed` naming those
/// they do.
pub fn model_allowed(caller: &Caller, alias: &str) -> crate::Result<()> {
    match &caller.models {
        Some(models) if !models.contains(alias) => {
            let mut allowed: Vec<&str> = models.iter().map(String::as_str).collect();
            allowed.truncate(20);
            let message = format!("your groups do not allow the model {alias:?} (they allow: {})", allowed.join(", "));
            Err(crate::Error::Forbidden("model_not_allowed", message))
        }
        _ => Ok(()),
    }
}

/// [`model_allowed`], then [`check`]: whether the caller may call `alias` now (the budget's
/// warning, if any).
pub async fn admit(s: &AppState, caller: &Caller, alias: &str) -> crate::Result<Option<HeaderValue>> {
    model_allowed(caller, alias)?;
    check(s, caller).await.map_err(|(message, retry_after)| crate::Error::BudgetExhausted { message, retry_after })
}

/// Counts `tokens` of `model` for the caller's person, in the background.
pub fn record(s: &AppState, caller: &Caller, model: &str, tokens: i64) {
    let (Some(identity), Some(user)) = (s.identity.clone(), caller.principal.user.clone()) else { return };
    let tally = Tally {
        tenant: caller.tenant.id.clone(),
        user,
        budget: caller.budget,
        address: caller.address.clone(),
        model: model.to_owned(),
    };
    tokio::spawn(tally.count(identity, tokens));
}

/// A caller as a session's [`caret_sessions::Spender`]: their model list and budget, their
/// calls counted for them.
pub struct Person {
    /// The server's state (to count and audit).
    pub state: AppState,
    /// Who started the session.
    pub caller: Caller,
}

#[async_trait::async_trait]
impl caret_sessions::Spender for Person {
    fn tenant(&self) -> &str {
        &self.caller.tenant.id
    }

    fn user(&self) -> Option<&str> {
        self.caller.principal.user.as_deref()
    }

    fn may_use(&self, alias: &str) -> Result<(), String> {
        model_allowed(&self.caller, alias).map_err(|e| e.to_string())
    }

    async fn admit(&self) -> Result<(), String> {
        check(&self.state, &self.caller).await.map(|_| ()).map_err(|(why, _)| why)
    }

    fn meter(&self, events: EventStream, model: &str) -> EventStream {
        metered(events, &self.state, &self.caller, model)
    }
}

/// Tokens spent for a person, to count.
struct Tally {
    tenant: String,
    user: String,
    budget: Option<i64>,
    /// Where the call came from, for the audit trail.
    address: String,
    model: String,
}

impl Tally {
    /// Counts `tokens`; crossing 80% or 100% of the budget goes to the audit trail, once.
    async fn count(self, identity: Arc<Identity>, tokens: i64) {
        match identity.spend(&self.tenant, &self.user, &self.model, tokens, self.budget).await {
            Ok(Crossed::Nothing) => {}
            Ok(crossed) => {
                let action = if crossed == Crossed::Warning { "budget.warning" } else { "budget.exhausted" };
                let event = caret_identity::audit::Event {
                    tenant: self.tenant.clone(),
                    actor: format!("user:{}", self.user),
                    address: self.address.clone(),
                    action: action.to_owned(),
                    target: format!("{} tokens a day", self.budget.unwrap_or_default()),
                    outcome: "ok".to_owned(),
                };
                if let Err(e) = identity.audit(event).await {
                    tracing::warn!(error = %e, "recording a budget crossing");
                }
            }
            Err(e) => tracing::warn!(error = %e, "counting a person's model tokens"),
        }
    }
}

/// The people behind runs: a run's model calls counted for the person who submitted it (runs
/// of service accounts and tenant tokens are the organisation's, with no budget), and its
/// owner record removed with it.
pub struct RunPeople {
    /// The identity store.
    pub identity: Arc<Identity>,
}

#[async_trait::async_trait]
impl caret_anyrun::runs::People for RunPeople {
    async fn admit(&self, tenant: &str, run: &str) -> Result<(), String> {
        let Ok(Some(owner)) = self.identity.owner(tenant, "run", run).await else { return Ok(()) };
        let Ok(Some(budget)) = self.identity.budget_of(tenant, &owner.user).await else { return Ok(()) };
        against(&self.identity, tenant, &owner.user, budget).await.map(|_| ()).map_err(|(why, _)| why)
    }

    fn spent(&self, tenant: &str, run: &str, model: &str, tokens: u64) {
        let (identity, tenant, run, model) =
            (self.identity.clone(), tenant.to_owned(), run.to_owned(), model.to_owned());
        tokio::spawn(async move {
            let Ok(Some(owner)) = identity.owner(&tenant, "run", &run).await else { return };
            let budget = identity.budget_of(&tenant, &owner.user).await.ok().flatten();
            let spent = Tally { tenant, user: owner.user, budget, address: format!("run {run}"), model };
            spent.count(identity, i64::try_from(tokens).unwrap_or(i64::MAX)).await;
        });
    }

    async fn gone(&self, tenant: &str, run: &str) {
        if let Err(e) = self.identity.disown(tenant, "run", run).await {
            tracing::warn!(error = %e, "forgetting a deleted run's owner");
        }
    }
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

#[cfg(test)]
mod tests {
    use caret_anyrun::runs::People as _;
    use caret_identity::people::{Membership, NewUser};
    use caret_identity::{Identity, Role};

    use super::*;

    #[tokio::test]
    async fn a_runs_calls_count_for_its_owner_stop_at_their_budget_and_its_owner_goes_with_it() {
        let dir = caret_test_support::TempDir::new();
        let which = caret_test_support::database::Which::Sqlite;
        let pool = caret_test_support::database::scratch_on(dir.path(), which, "CARET_TEST_DATABASE_URL")
            .await
            .expect("SQLite is always there");
        let identity = Arc::new(Identity::open(pool, caret_db::Dialect::Sqlite).await.unwrap());
        let new = NewUser {
            email: "dan@acme.example".into(),
            name: String::new(),
            role: Role::Member,
            source: "admin".into(),
        };
        let dan = identity.create_user("acme", new).await.unwrap();
        let interns = identity.create_group("acme", "interns", "admin").await.unwrap();
        identity.set_member("acme", &interns.id, &dan.id, Membership::In).await.unwrap();
        identity.set_group_budget("acme", &interns.id, Some(100)).await.unwrap();
        identity.own("acme", "run", "r-dans", &dan.id).await.unwrap();
        let people = RunPeople { identity: identity.clone() };

        people.admit("acme", "r-dans").await.unwrap();
        people.spent("acme", "r-dans", "fast", 120);
        people.spent("acme", "r-organisations", "fast", 1000);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while identity.spent_today("acme", &dan.id).await.unwrap() < 120 {
            assert!(std::time::Instant::now() < until, "the run's tokens were never counted for dan");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let refused = people.admit("acme", "r-dans").await.unwrap_err();
        assert!(refused.contains("daily budget of 100"), "{refused}");
        people.admit("acme", "r-organisations").await.expect("a run without an owner has no budget");
        assert_eq!(identity.spent_today("acme", &dan.id).await.unwrap(), 120, "nobody else's run counted for dan");
        // Crossing the budget is in the audit trail, as dan's, from the run.
        let filter = caret_identity::audit::Filter { tenant: Some("acme".into()), limit: 10, ..Default::default() };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let records = identity.audit_records(&filter).await.unwrap();
            if let Some(r) = records.iter().find(|r| r.event.action == "budget.exhausted") {
                assert_eq!(
                    (r.event.actor.as_str(), r.event.address.as_str()),
                    (&*format!("user:{}", dan.id), "run r-dans")
                );
                break;
            }
            assert!(std::time::Instant::now() < until, "no budget.exhausted record: {records:?}");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // Deleted (by a person or by retention): its owner record goes too.
        assert!(identity.owner("acme", "run", "r-dans").await.unwrap().is_some());
        people.gone("acme", "r-dans").await;
        assert_eq!(identity.owner("acme", "run", "r-dans").await.unwrap(), None);
    }
}
