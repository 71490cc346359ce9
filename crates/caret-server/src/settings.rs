//! An organisation's settings and flags for its admins: `/v1/admin/settings` (who may add
//! @Docs sources, the longest life of a personal token; each change audited) and
//! `/v1/admin/flags` (the operator's flags as they fall for this organisation, read-only:
//! flags are the operator's to set, on the server host).

use axum::Extension;
use axum::extract::State;
use caret_identity::Role;
use caret_identity::settings::Change;
use caret_protocol::admin::{ChangeSettings, FlagInfo, Settings};

use crate::state::{AppState, Caller, Json};
use crate::{Error, Result};

/// The least role that may add and remove @Docs sources in the caller's organisation: its
/// setting, else the server's.
pub async fn docs_managed_by(state: &AppState, caller: &Caller, server_default: Role) -> Result<Role> {
    let Some(identity) = &state.identity else { return Ok(server_default) };
    Ok(match identity.settings(&caller.tenant.id).await?.docs_sources.as_deref() {
        Some("admins") => Role::Admin,
        Some("members") => Role::Member,
        _ => server_default,
    })
}

/// The longest a personal token of the caller's organisation may live, days.
pub async fn token_max_days(state: &AppState, caller: &Caller) -> Result<u32> {
    let Some(identity) = &state.identity else { return Ok(366) };
    Ok(identity.settings(&caller.tenant.id).await?.token_max_days.unwrap_or(366))
}

async fn current(state: &AppState, caller: &Caller) -> Result<Settings> {
    let server_docs = state.docs.as_ref().map_or(Role::Member, |d| d.managed_by());
    let own = state.identity()?.settings(&caller.tenant.id).await?;
    let mut overridden = Vec::new();
    if own.docs_sources.is_some() {
        overridden.push("docs_sources".to_owned());
    }
    if own.token_max_days.is_some() {
        overridden.push("token_max_days".to_owned());
    }
    let docs = docs_managed_by(state, caller, server_docs).await?;
    Ok(Settings {
        docs_sources: if docs >= Role::Admin { "admins" } else { "members" }.to_owned(),
        token_max_days: own.token_max_days.unwrap_or(366),
        overridden,
    })
}

/// `GET /v1/admin/settings`.
pub async fn get(State(state): State<AppState>, Extension(caller): Extension<Caller>) -> Result<axum::Json<Settings>> {
    Ok(axum::Json(current(&state, &caller).await?))
}

/// `PATCH /v1/admin/settings`: each named setting changed (`default`, or 0 days, gives it back
/// to the server), recorded.
pub async fn change(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<ChangeSettings>,
) -> Result<axum::Json<Settings>> {
    let identity = state.identity()?.clone();
    let docs = req.docs_sources.map(|v| if v == "default" { Change::Default } else { Change::Set(v) });
    let days = match req.token_max_days {
        None => None,
        Some(0) => Some(Change::Default),
        Some(d) => Some(Change::Set(u32::try_from(d).map_err(|_| Error::BadRequest(format!("{d} days")))?)),
    };
    let names: Vec<&str> = [docs.as_ref().map(|_| "docs_sources"), days.as_ref().map(|_| "token_max_days")]
        .into_iter()
        .flatten()
        .collect();
    if names.is_empty() {
        return Err(Error::BadRequest("name a setting to change: docs_sources, token_max_days".into()));
    }
    let tenant = caller.tenant.id.clone();
    state
        .audited(&caller, "settings.change", &names.join(","), async {
            Ok(identity.change_settings(&tenant, docs, days).await?)
        })
        .await?;
    Ok(axum::Json(current(&state, &caller).await?))
}

/// `GET /v1/admin/flags`: every flag with a rule, as it falls for this organisation.
pub async fn flags(State(state): State<AppState>, Extension(caller): Extension<Caller>) -> axum::Json<Vec<FlagInfo>> {
    let Some(cluster) = &state.cluster else { return axum::Json(Vec::new()) };
    let flags = cluster.flags();
    let mut names: Vec<String> = flags.rules().iter().map(|r| r.name.clone()).collect();
    names.sort();
    names.dedup();
    axum::Json(
        names
            .into_iter()
            .map(|name| {
                let on = flags.allows(&name, Some(&caller.tenant.id));
                let own =
                    flags.rules().iter().any(|r| r.name == name && r.tenant.as_deref() == Some(&caller.tenant.id));
                FlagInfo { name, on, rule: if own { "this organisation" } else { "every organisation" }.to_owned() }
            })
            .collect(),
    )
}
