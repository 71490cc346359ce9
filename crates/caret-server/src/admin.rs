//! Who the caller is (`/v1/me`), their own tokens (`/v1/me/tokens`) and the admin API
//! (`/v1/admin/…`: people, roles, groups, tokens, the audit trail). The admin routes need
//! the `admin` scope, which only admins and owners hold; making or unmaking an owner needs an
//! owner. Every change is written to the audit trail, with its outcome, before the answer.

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use caret_identity::model::{Credential, Group, User};
use caret_identity::people::{Membership, NewUser};
use caret_identity::tokens::{Holder, NewCredential};
use caret_identity::{CredentialKind, Role, Scope, Scopes, UserState};
use caret_protocol::admin::{
    AcceptInvitation, AddPerson, AuditQuery, AuditRecord, AuditVerification, ChangePerson, CreateGroup, CreateToken,
    GroupBudget, GroupInfo, GroupModels, Invite, Invited, Joined, Me, Person, TokenCreated, TokenInfo, UsageReport,
    UsageRow, UsageTotal,
};

use crate::state::{AppState, Caller, Json, Path, Query};
use crate::{Error, Result};

fn person(u: User) -> Person {
    Person {
        id: u.id,
        email: u.email,
        name: u.name,
        role: u.role.name().into(),
        state: u.state.name().into(),
        source: u.source,
        created_at: u.created_at,
    }
}

fn token_info(c: Credential) -> TokenInfo {
    TokenInfo {
        id: c.id,
        name: c.name,
        kind: c.kind.name().into(),
        user: c.user,
        role: c.role.name().into(),
        scopes: c.scopes.names().into_iter().map(String::from).collect(),
        created_at: c.created_at,
        expires_at: c.expires_at,
        last_used_at: c.last_used_at,
        revoked_at: c.revoked_at,
    }
}

fn group_info(g: Group) -> GroupInfo {
    GroupInfo {
        id: g.id,
        name: g.name,
        source: g.source,
        members: g.members,
        models: g.models,
        daily_tokens: g.daily_tokens,
    }
}

fn role(text: Option<&str>, default: Role) -> Result<Role> {
    text.map_or(Ok(default), |r| r.parse().map_err(Error::BadRequest))
}

/// `GET /v1/me`.
pub async fn me(State(state): State<AppState>, Extension(caller): Extension<Caller>) -> Result<axum::Json<Me>> {
    let p = &caller.principal;
    let spent_today = match (&state.identity, &p.user) {
        (Some(identity), Some(user)) => identity.spent_today(&caller.tenant.id, user).await?,
        _ => 0,
    };
    Ok(axum::Json(Me {
        organisation: caller.tenant.id.clone(),
        organisation_name: caller.tenant.name.clone(),
        user: p.user.clone(),
        name: p.name.clone(),
        role: p.role.name().into(),
        scopes: p.scopes.names().into_iter().map(String::from).collect(),
        kind: p.kind.name().into(),
        credential: p.credential.clone(),
        expires_at: p.expires_at,
        daily_tokens: caller.budget,
        spent_today,
    }))
}

/// The scopes a request asks for, or the default: all the role allows but `admin`.
fn scopes(asked: &[String], role: Role) -> Result<Scopes> {
    if asked.is_empty() {
        return Ok(role.allows().without(Scope::Admin));
    }
    Scopes::parse(&asked.join(",")).map_err(Error::BadRequest)
}

/// Expiry from a request: 90 days (or `max`, when less) unless asked, at most `max`.
fn expiry(days: Option<u32>, max: u32) -> Result<Option<i64>> {
    let days = days.unwrap_or(90.min(max));
    if !(1..=max).contains(&days) {
        return Err(Error::BadRequest(format!("expires_in_days is 1 to {max} here, not {days}")));
    }
    Ok(Some(caret_identity::db::now_ms() + i64::from(days) * 86_400_000))
}

/// The caller's person, or 403 for a service account.
fn own_user(caller: &Caller) -> Result<&str> {
    caller.principal.user.as_deref().ok_or_else(|| {
        Error::Forbidden("forbidden", "a service account has no tokens of its own: an admin makes them".into())
    })
}

/// `GET /v1/me/tokens`.
pub async fn my_tokens(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<axum::Json<Vec<TokenInfo>>> {
    let user = own_user(&caller)?;
    let list = state.identity()?.credentials(&caller.tenant.id, Some(user)).await?;
    Ok(axum::Json(list.into_iter().map(token_info).collect()))
}

/// `POST /v1/me/tokens`: a personal access token.
pub async fn create_my_token(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<CreateToken>,
) -> Result<Response> {
    let user = own_user(&caller)?.to_owned();
    if req.role.is_some() {
        return Err(Error::BadRequest("a personal token acts with its person's role".into()));
    }
    let new = NewCredential {
        holder: Holder::User(user),
        kind: CredentialKind::Personal,
        name: req.name.clone(),
        scopes: scopes(&req.scopes, caller.principal.role)?,
        expires_at: expiry(req.expires_in_days, crate::settings::token_max_days(&state, &caller).await?)?,
    };
    make_token(&state, &caller, new).await
}

/// Makes `new` in the caller's organisation, recorded; answers 201 with the token, once.
async fn make_token(state: &AppState, caller: &Caller, new: NewCredential) -> Result<Response> {
    let identity = state.identity()?.clone();
    let (tenant, name) = (caller.tenant.id.clone(), new.name.clone());
    let (token, c) = state
        .audited(caller, "token.create", &name, async { Ok(identity.create_credential(&tenant, new).await?) })
        .await?;
    Ok((StatusCode::CREATED, axum::Json(TokenCreated { token, info: token_info(c) })).into_response())
}

/// `DELETE /v1/me/tokens/{id}`.
pub async fn revoke_my_token(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<axum::Json<TokenInfo>> {
    let user = own_user(&caller)?.to_owned();
    let identity = state.identity()?.clone();
    let tenant = caller.tenant.id.clone();
    let c = state
        .audited(&caller, "token.revoke", &id, async {
            let c = identity.credential(&tenant, &id).await?;
            if c.user.as_deref() != Some(user.as_str()) {
                return Err(Error::NotFound(format!("token {id}")));
            }
            Ok(identity.revoke(&tenant, &id).await?)
        })
        .await?;
    state.credentials.observe(identity.epoch().await?);
    Ok(axum::Json(token_info(c)))
}

/// `GET /v1/admin/users`.
pub async fn users(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<axum::Json<Vec<Person>>> {
    Ok(axum::Json(state.identity()?.users(&caller.tenant.id).await?.into_iter().map(person).collect()))
}

/// `GET /v1/admin/users/{id}`.
pub async fn user(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<axum::Json<Person>> {
    Ok(axum::Json(person(state.identity()?.user(&caller.tenant.id, &id).await?)))
}

/// `POST /v1/admin/users`: a person added by hand (an owner only by an owner).
pub async fn add_user(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<AddPerson>,
) -> Result<Response> {
    let role = role(req.role.as_deref(), Role::Member)?;
    let identity = state.identity()?.clone();
    let tenant = caller.tenant.id.clone();
    let u = state
        .audited(&caller, "user.add", &req.email, async {
            if role == Role::Owner {
                caller.at_least(Role::Owner)?;
            }
            let new = NewUser { email: req.email.clone(), name: req.name.clone(), role, source: "admin".into() };
            Ok(identity.create_user(&tenant, new).await?)
        })
        .await?;
    Ok((StatusCode::CREATED, axum::Json(person(u))).into_response())
}

/// `PATCH /v1/admin/users/{id}`: a role or a state. Owners' roles and states are an owner's
/// to change; deactivation ends every credential of the person at once.
pub async fn change_user(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Json(req): Json<ChangePerson>,
) -> Result<axum::Json<Person>> {
    let identity = state.identity()?.clone();
    let tenant = caller.tenant.id.clone();
    let action = match (&req.role, &req.state) {
        (Some(_), None) => "user.role",
        (None, Some(_)) => "user.state",
        _ => "user.change",
    };
    let u = state
        .audited(&caller, action, &id, async {
            let before = identity.user(&tenant, &id).await?;
            let new_role = role(req.role.as_deref(), before.role)?;
            if before.role == Role::Owner || new_role == Role::Owner {
                caller.at_least(Role::Owner)?;
            }
            let mut u = before;
            if new_role != u.role {
                u = identity.set_role(&tenant, &id, new_role).await?;
            }
            if let Some(s) = &req.state {
                let state = match s.as_str() {
                    "active" => UserState::Active,
                    "deactivated" => UserState::Deactivated,
                    other => return Err(Error::BadRequest(format!("a state is active or deactivated, not {other:?}"))),
                };
                if state != u.state {
                    u = identity.set_state(&tenant, &id, state).await?;
                }
            }
            Ok(u)
        })
        .await?;
    state.credentials.observe(identity.epoch().await?);
    Ok(axum::Json(person(u)))
}

/// `GET /v1/admin/tokens`: service accounts' and people's personal tokens, and the
/// organisation's tenant tokens made before people existed.
pub async fn tokens(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<axum::Json<Vec<TokenInfo>>> {
    let mut list: Vec<TokenInfo> =
        state.identity()?.credentials(&caller.tenant.id, None).await?.into_iter().map(token_info).collect();
    for t in state.service.db().tenant_tokens(&caller.tenant.id).await? {
        list.push(TokenInfo {
            id: t.id,
            name: t.name,
            kind: "tenant".into(),
            user: None,
            role: Role::Member.name().into(),
            scopes: Role::Member.allows().names().into_iter().map(String::from).collect(),
            created_at: t.created_at * 1000,
            expires_at: None,
            last_used_at: None,
            revoked_at: t.revoked_at.map(|r| r * 1000),
        });
    }
    Ok(axum::Json(list))
}

/// `POST /v1/admin/tokens`: a service account's token (for CI and scripts).
pub async fn create_token(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<CreateToken>,
) -> Result<Response> {
    let role = role(req.role.as_deref(), Role::Member)?;
    if role == Role::Owner {
        return Err(Error::BadRequest("a service account is a member or an admin".into()));
    }
    if req.kind.as_deref() == Some("scim") {
        // The identity provider's: it manages people and groups, and opens nothing else.
        let new = NewCredential {
            holder: Holder::Service(Role::Admin),
            kind: CredentialKind::Scim,
            name: req.name.clone(),
            scopes: Scopes::NONE.with(Scope::Admin),
            expires_at: expiry(req.expires_in_days, crate::settings::token_max_days(&state, &caller).await?)?,
        };
        return make_token(&state, &caller, new).await;
    }
    if req.kind.as_deref().is_some_and(|k| k != "service") {
        return Err(Error::BadRequest("a token's kind is service or scim".into()));
    }
    let new = NewCredential {
        holder: Holder::Service(role),
        kind: CredentialKind::Service,
        name: req.name.clone(),
        scopes: scopes(&req.scopes, role)?,
        expires_at: expiry(req.expires_in_days, crate::settings::token_max_days(&state, &caller).await?)?,
    };
    make_token(&state, &caller, new).await
}

/// `DELETE /v1/admin/tokens/{id}`: any token of the organisation, tenant tokens included.
pub async fn revoke_token(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    let identity = state.identity()?.clone();
    let tenant = caller.tenant.id.clone();
    let db = state.service.db().clone();
    state
        .audited(&caller, "token.revoke", &id, async {
            match identity.revoke(&tenant, &id).await {
                Ok(_) => Ok(()),
                Err(caret_identity::Error::NotFound(_)) if db.revoke_tenant_token(&tenant, &id).await? => {
                    Ok(identity.moved().await?)
                }
                Err(e) => Err(e.into()),
            }
        })
        .await?;
    state.credentials.observe(identity.epoch().await?);
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/admin/groups`.
pub async fn groups(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<axum::Json<Vec<GroupInfo>>> {
    Ok(axum::Json(state.identity()?.groups(&caller.tenant.id).await?.into_iter().map(group_info).collect()))
}

/// `POST /v1/admin/groups`.
pub async fn create_group(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<CreateGroup>,
) -> Result<Response> {
    let identity = state.identity()?.clone();
    let tenant = caller.tenant.id.clone();
    let g = state
        .audited(&caller, "group.create", &req.name, async {
            Ok(identity.create_group(&tenant, &req.name, "admin").await?)
        })
        .await?;
    Ok((StatusCode::CREATED, axum::Json(group_info(g))).into_response())
}

/// `DELETE /v1/admin/groups/{id}`.
pub async fn delete_group(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    let identity = state.identity()?.clone();
    let tenant = caller.tenant.id.clone();
    state.audited(&caller, "group.delete", &id, async { Ok(identity.delete_group(&tenant, &id).await?) }).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /v1/admin/groups/{id}/members/{user}`.
pub async fn add_member(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((group, user)): Path<(String, String)>,
) -> Result<StatusCode> {
    member(&state, &caller, &group, &user, Membership::In).await
}

/// `DELETE /v1/admin/groups/{id}/members/{user}`.
pub async fn remove_member(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((group, user)): Path<(String, String)>,
) -> Result<StatusCode> {
    member(&state, &caller, &group, &user, Membership::Out).await
}

async fn member(state: &AppState, caller: &Caller, group: &str, user: &str, m: Membership) -> Result<StatusCode> {
    let identity = state.identity()?.clone();
    let action = if m == Membership::In { "group.member.add" } else { "group.member.remove" };
    state
        .audited(caller, action, &format!("{group}/{user}"), async {
            Ok(identity.set_member(&caller.tenant.id, group, user, m).await?)
        })
        .await?;
    state.credentials.observe(identity.epoch().await?);
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /v1/admin/groups/{id}/models`: the model aliases the group's members may use.
pub async fn group_models(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Json(req): Json<GroupModels>,
) -> Result<StatusCode> {
    let identity = state.identity()?.clone();
    let tenant = caller.tenant.id.clone();
    state
        .audited(&caller, "group.models", &id, async {
            Ok(identity.set_group_models(&tenant, &id, req.models.as_deref()).await?)
        })
        .await?;
    state.credentials.observe(identity.epoch().await?);
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /v1/admin/groups/{id}/budget`.
pub async fn group_budget(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Json(req): Json<GroupBudget>,
) -> Result<StatusCode> {
    let identity = state.identity()?.clone();
    let tenant = caller.tenant.id.clone();
    state
        .audited(&caller, "group.budget", &id, async {
            Ok(identity.set_group_budget(&tenant, &id, req.daily_tokens).await?)
        })
        .await?;
    state.credentials.observe(identity.epoch().await?);
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/admin/usage`'s query.
#[derive(Debug, serde::Deserialize)]
pub struct UsageQuery {
    /// Days back, today included (default 7, at most 366).
    days: Option<i64>,
}

/// `GET /v1/admin/usage`: model tokens spent per person, per model and per group.
pub async fn usage(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<UsageQuery>,
) -> Result<axum::Json<UsageReport>> {
    use std::collections::BTreeMap;
    let days = q.days.unwrap_or(7);
    if !(1..=366).contains(&days) {
        return Err(Error::BadRequest(format!("days is 1 to 366, not {days}")));
    }
    let identity = state.identity()?;
    let tenant = &caller.tenant.id;
    let since = caret_identity::budgets::day_of(caret_identity::db::now_ms()) - (days - 1);
    let spent = identity.spending(tenant, since).await?;
    let emails: BTreeMap<String, String> = identity.users(tenant).await?.into_iter().map(|u| (u.id, u.email)).collect();
    let groups = identity.groups(tenant).await?;
    let day_name = |day: i64| caret_usage::hour_name(day * 24).split('T').next().unwrap_or_default().to_owned();
    let mut by_person: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut by_model: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut by_group: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let add = |m: &mut BTreeMap<String, (i64, i64)>, k: &str, s: &caret_identity::budgets::Spent| {
        let e = m.entry(k.to_owned()).or_default();
        e.0 += s.tokens;
        e.1 += s.requests;
    };
    let mut rows = Vec::new();
    for s in &spent {
        let email = emails.get(&s.user).cloned().unwrap_or_else(|| format!("(removed) {}", s.user));
        add(&mut by_person, &email, s);
        add(&mut by_model, &s.model, s);
        for g in groups.iter().filter(|g| g.members.contains(&s.user)) {
            add(&mut by_group, &g.name, s);
        }
        rows.push(UsageRow {
            day: day_name(s.day),
            user: s.user.clone(),
            email,
            model: s.model.clone(),
            tokens: s.tokens,
            requests: s.requests,
        });
    }
    let totals = |m: BTreeMap<String, (i64, i64)>| {
        let mut v: Vec<UsageTotal> =
            m.into_iter().map(|(name, (tokens, requests))| UsageTotal { name, tokens, requests }).collect();
        v.sort_by(|a, b| b.tokens.cmp(&a.tokens).then(a.name.cmp(&b.name)));
        v
    };
    let activity = activity(&state, tenant, since * 24, &emails).await?;
    Ok(axum::Json(UsageReport {
        since: day_name(since),
        rows,
        by_person: totals(by_person),
        by_model: totals(by_model),
        by_group: totals(by_group),
        activity,
    }))
}

/// What each person of `tenant` did since `since_hour`, per event, from the usage files
/// (nothing where this server does not collect usage).
async fn activity(
    state: &AppState,
    tenant: &str,
    since_hour: i64,
    emails: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<caret_protocol::admin::Activity>> {
    if !state.usage.is_on() {
        return Ok(Vec::new());
    }
    let read = caret_usage::read(state.service.store().as_ref(), Some(tenant), since_hour)
        .await
        .map_err(|e| Error::Internal(format!("reading usage: {e}")))?;
    let mut by: std::collections::BTreeMap<(String, String), (u64, u64)> = Default::default();
    for s in caret_usage::summarise(&read.rows, true).into_iter().filter(|s| !s.user.is_empty()) {
        let e = by.entry((s.user, s.event)).or_default();
        e.0 += s.count;
        e.1 += s.failed;
    }
    Ok(by
        .into_iter()
        .map(|((user, event), (count, failed))| caret_protocol::admin::Activity {
            email: emails.get(&user).cloned().unwrap_or_else(|| format!("(removed) {user}")),
            user,
            event,
            count,
            failed,
        })
        .collect())
}

/// `GET /v1/admin/audit`: the organisation's records, oldest first.
pub async fn audit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<AuditQuery>,
) -> Result<axum::Json<Vec<AuditRecord>>> {
    let filter = caret_identity::audit::Filter {
        tenant: Some(caller.tenant.id.clone()),
        since_ms: q.since_ms,
        actor: q.user.map(|u| format!("user:{u}")),
        after_seq: q.after,
        limit: q.limit.unwrap_or(100).clamp(1, 1000),
    };
    let records = state.identity()?.audit_records(&filter).await?;
    Ok(axum::Json(
        records
            .into_iter()
            .map(|r| AuditRecord {
                seq: r.seq,
                at_ms: r.at_ms,
                actor: r.event.actor,
                address: r.event.address,
                action: r.event.action,
                target: r.event.target,
                outcome: r.event.outcome,
                prev_hash: r.prev_hash,
                hash: r.hash,
            })
            .collect(),
    ))
}

/// `POST /v1/admin/audit/verify`: the whole chain checked.
pub async fn verify(State(state): State<AppState>) -> Result<axum::Json<AuditVerification>> {
    let identity = state.identity()?;
    let mut v = identity.verify_audit().await?;
    v.problems.extend(identity.verify_exports(state.service.store().as_ref()).await?);
    Ok(axum::Json(AuditVerification { records: v.records, head: v.head, problems: v.problems }))
}

/// `POST /v1/admin/invitations`: a single-use code for one email and role (an owner's to give
/// an owner's role).
pub async fn invite(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<Invite>,
) -> Result<Response> {
    let role = role(req.role.as_deref(), Role::Member)?;
    let identity = state.identity()?.clone();
    let tenant = caller.tenant.id.clone();
    let (code, inv) = state
        .audited(&caller, "invitation.create", &req.email, async {
            if role == Role::Owner {
                caller.at_least(Role::Owner)?;
            }
            Ok(identity.invite(&tenant, &req.email, role, req.days.unwrap_or(7), &caller.principal.actor()).await?)
        })
        .await?;
    let invited =
        Invited { id: inv.id, code, email: inv.email, role: inv.role.name().into(), expires_at: inv.expires_at };
    Ok((StatusCode::CREATED, axum::Json(invited)).into_response())
}

/// `POST /v1/invitations/accept` (no token: the code is the credential): the person joins
/// and gets their first token. Limited per client address like a failed sign-in; a code is
/// used once.
pub async fn accept(
    State(state): State<AppState>,
    peer: Option<Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    Json(req): Json<AcceptInvitation>,
) -> Result<Response> {
    let address = peer.map_or_else(|| "-".to_owned(), |Extension(c)| c.0.ip().to_string());
    if let Err(retry_after) = state.ip_limiter.check(&address, std::time::Instant::now()) {
        return Err(Error::RateLimited { retry_after });
    }
    let identity = state.identity()?.clone();
    let joined = identity.accept(&req.code, &req.name).await.map_err(Error::from);
    let event = |tenant: &str, actor: String, outcome: String| caret_identity::audit::Event {
        tenant: tenant.to_owned(),
        actor,
        address: address.clone(),
        action: "invitation.accept".into(),
        target: "-".into(),
        outcome,
    };
    let joined = match joined {
        Ok(j) => {
            state.record(event(&j.user.tenant, format!("user:{}", j.user.id), "ok".into())).await?;
            j
        }
        Err(e) => {
            state.record(event("-", "anonymous".into(), format!("failed: {}", e.status().1))).await?;
            return Err(e);
        }
    };
    let organisation_name = state.service.db().tenant(&joined.user.tenant).await?.map(|t| t.name).unwrap_or_default();
    let token = TokenCreated { token: joined.token, info: token_info(joined.credential) };
    let body = Joined { organisation_name, person: person(joined.user), token };
    Ok((StatusCode::CREATED, axum::Json(body)).into_response())
}

/// `GET /admin`: the admin page (it asks for a token and reads the admin API with it).
pub async fn page() -> Response {
    crate::runs::dashboard_asset("text/html; charset=utf-8", include_str!("admin_page/index.html"))
}

/// `GET /admin/app.js`.
pub async fn page_script() -> Response {
    crate::runs::dashboard_asset("text/javascript; charset=utf-8", include_str!("admin_page/app.js"))
}
