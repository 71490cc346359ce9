//! Signing in through the organisation's identity provider (`/v1/auth/…`). The server is the
//! OpenID Connect client of the provider and, for its own clients, a small OAuth server:
//!
//! - the team pages: `/v1/auth/login?next=/admin` → provider → `/v1/auth/callback` → an
//!   HttpOnly, Secure, SameSite session cookie and a CSRF cookie the page sends back in
//!   `X-CSRF-Token` on every change;
//! - a client with a browser (`caret login`): `/v1/auth/login?redirect_uri=http://127.0.0.1:…`
//!   with the client's PKCE challenge → provider → a one-time code on the client's loopback
//!   redirect → `POST /v1/auth/token` with the client's verifier;
//! - a machine without one: `POST /v1/auth/device` (RFC 8628), its person opening
//!   `/v1/auth/device` elsewhere, the machine polling `POST /v1/auth/token`;
//! - a directory (LDAP) instead of a provider: `POST /v1/auth/ldap` with a user name and
//!   password, answered with tokens or (for the pages) the session's cookies.
//!
//! Every sign-in and failure is written to the audit trail.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use caret_identity::oidc::Oidc;
use caret_identity::signins::{DevicePoll, Joining, PAGE_MS, Purpose, SessionTokens};
use caret_protocol::auth::{DeviceAuthorization, Methods, TokenResponse};
use serde::Deserialize;

use crate::state::{AppState, Caller, Query};
use crate::{Error, Result};

/// The session cookie of the team pages.
pub const SESSION_COOKIE: &str = "caret_session";
/// The cookie holding the page's CSRF token.
pub const CSRF_COOKIE: &str = "caret_csrf";
/// The header a page sends its CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";

pub use crate::state::SignIn;

fn oidc(state: &AppState) -> Result<(&SignIn, &Arc<Oidc>)> {
    // Without a provider, the sign-in routes answer as absent ones.
    let none = || Error::NotFound("sign-in through an identity provider on this server".into());
    let s = state.sign_in.as_deref().ok_or_else(none)?;
    let o = s.oidc.as_ref().ok_or_else(none)?;
    Ok((s, o))
}

/// The id of the organisation people sign in to (`organisation` names it or gives its id).
async fn organisation(state: &AppState, oidc: &Oidc) -> Result<String> {
    organisation_named(state, &oidc.settings().organisation).await
}

async fn organisation_named(state: &AppState, named: &str) -> Result<String> {
    let db = state.service.db();
    match db.tenant_by_name(named).await? {
        Some(t) => Ok(t.id),
        None => db.tenant(named).await?.map(|t| t.id).ok_or_else(|| {
            Error::Unavailable(format!("the organisation {named:?} people sign in to does not exist on this server"))
        }),
    }
}

/// The CSRF token of a page session: bound to it, unknowable without it.
pub fn csrf_of(session: &str) -> String {
    caret_identity::oidc::challenge_of(&format!("caret-csrf:{session}"))
}

/// A cookie's value from the request.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// `GET /v1/auth/methods`: how one signs in here.
pub async fn methods(State(state): State<AppState>) -> axum::Json<Methods> {
    let oidc = state.sign_in.as_ref().is_some_and(|s| s.oidc.is_some());
    let ldap = state.sign_in.as_ref().is_some_and(|s| s.ldap.is_some());
    axum::Json(Methods { oidc, device: oidc, ldap, tokens: state.identity.is_some() })
}

/// `GET /v1/auth/login`'s query.
#[derive(Debug, Deserialize)]
pub struct Login {
    /// A page's path to return to (the team pages).
    next: Option<String>,
    /// A client's loopback redirect.
    redirect_uri: Option<String>,
    /// The client's state.
    state: Option<String>,
    /// The client's PKCE challenge.
    code_challenge: Option<String>,
    /// Must be `S256`.
    code_challenge_method: Option<String>,
}

/// Whether `uri` is a loopback redirect (RFC 8252: http, a loopback host, any port).
fn loopback_redirect(uri: &str) -> bool {
    url::Url::parse(uri).is_ok_and(|u| {
        u.scheme() == "http"
            && u.username().is_empty()
            && u.password().is_none()
            && u.fragment().is_none()
            && matches!(u.host_str(), Some("127.0.0.1" | "[::1]" | "localhost"))
    })
}

/// A path on this server to go to after signing in (nothing that leaves it).
fn local_path(next: &str) -> Result<String> {
    let ok = next.starts_with('/') && !next.starts_with("//") && !next.contains('\\') && next.len() <= 512;
    if ok { Ok(next.to_owned()) } else { Err(Error::BadRequest("next must be a path on this server".into())) }
}

/// `GET /v1/auth/login`: off to the provider.
pub async fn login(State(state): State<AppState>, Query(q): Query<Login>) -> Result<Response> {
    let (sign_in, oidc) = oidc(&state)?;
    let purpose = match (q.redirect_uri, q.next) {
        (Some(redirect_uri), _) => {
            if !loopback_redirect(&redirect_uri) {
                return Err(Error::BadRequest(
                    "redirect_uri must be an http loopback address (127.0.0.1, [::1])".into(),
                ));
            }
            let challenge = q.code_challenge.unwrap_or_default();
            let b64url = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
            if q.code_challenge_method.as_deref() != Some("S256")
                || challenge.len() != 43
                || !challenge.chars().all(b64url)
            {
                return Err(Error::BadRequest("a client needs an S256 code_challenge (PKCE)".into()));
            }
            let client_state = q.state.unwrap_or_default();
            if client_state.is_empty() || client_state.len() > 256 {
                return Err(Error::BadRequest("a client needs a state of 1 to 256 characters".into()));
            }
            Purpose::Client { redirect_uri, state: client_state, challenge }
        }
        (None, next) => Purpose::Page { next: local_path(next.as_deref().unwrap_or("/admin"))? },
    };
    to_provider(&state, sign_in, oidc, purpose).await
}

async fn to_provider(state: &AppState, sign_in: &SignIn, oidc: &Oidc, purpose: Purpose) -> Result<Response> {
    let identity = state.identity()?;
    let (s, pending) = identity.begin_sign_in(&organisation(state, oidc).await?, purpose).await?;
    let challenge = caret_identity::oidc::challenge_of(&pending.verifier);
    let url = oidc.authorize_url(&sign_in.callback(), &s, &pending.nonce, &challenge).await?;
    Ok(Redirect::to(&url).into_response())
}

/// `GET /v1/auth/callback`'s query (the provider's answer).
#[derive(Debug, Deserialize)]
pub struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// `GET /v1/auth/callback`: the provider's answer, checked; then the sign-in's purpose.
pub async fn callback(
    State(state): State<AppState>,
    extensions: axum::http::Extensions,
    Query(q): Query<Callback>,
) -> Result<Response> {
    let (sign_in, oidc) = oidc(&state)?;
    let identity = state.identity()?.clone();
    let address = crate::state::peer_address(&extensions);
    let tenant = organisation(&state, oidc).await?;
    let checked = async {
        if let Some(e) = &q.error {
            let why = q.error_description.as_deref().unwrap_or(e).chars().take(200).collect::<String>();
            return Err(Error::Forbidden("forbidden", format!("the provider refused the sign-in: {why}")));
        }
        let (Some(code), Some(s)) = (&q.code, &q.state) else {
            return Err(Error::BadRequest("the provider's answer lacks code or state".into()));
        };
        let pending = identity.take_sign_in(s).await?;
        let who = oidc.finish(code, &pending.verifier, &sign_in.callback(), &pending.nonce).await?;
        let joining = Joining {
            source: "oidc",
            signup: oidc.settings().signup,
            role: oidc.role_of(&who.groups),
            sync_groups: oidc.settings().sync_groups,
        };
        let user = identity.signed_in(&pending.tenant, &who, &joining).await?;
        Ok((pending, user))
    }
    .await;
    recorded(&state, &tenant, &address, "sign_in.oidc", checked.as_ref().map(|(_, user)| user)).await?;
    let (pending, user) = checked?;
    match pending.purpose {
        Purpose::Page { next } => {
            let tokens = identity.issue_session(&pending.tenant, &user, "team page", PAGE_MS, false, None).await?;
            Ok(page_session(&tokens, &next))
        }
        Purpose::Client { redirect_uri, state: client_state, challenge } => {
            let code = identity.issue_code(&pending.tenant, &user.id, &redirect_uri, &challenge).await?;
            let mut to = url::Url::parse(&redirect_uri).map_err(|e| Error::BadRequest(e.to_string()))?;
            to.query_pairs_mut().append_pair("code", &code).append_pair("state", &client_state);
            Ok(Redirect::to(to.as_str()).into_response())
        }
        Purpose::Device { user_code } => {
            identity.approve_device(&pending.tenant, &user_code, &user.id).await?;
            Ok(message_page(
                "Signed in",
                &format!("{} is signed in on the device showing {user_code}. You may close this tab.", user.email),
            ))
        }
    }
}

/// Writes a sign-in (`action`) and its outcome to the audit trail, before the answer: who
/// signed in, or the failure's code (never a name or password that did not sign in).
async fn recorded(
    state: &AppState,
    tenant: &str,
    address: &str,
    action: &str,
    signed_in: std::result::Result<&caret_identity::model::User, &Error>,
) -> Result<()> {
    let (actor, target, outcome) = match signed_in {
        Ok(user) => (format!("user:{}", user.id), user.email.clone(), "ok".to_owned()),
        Err(e) => ("-".to_owned(), "-".to_owned(), format!("failed: {}", e.status().1)),
    };
    let event = caret_identity::audit::Event {
        tenant: tenant.to_owned(),
        actor,
        address: address.to_owned(),
        action: action.to_owned(),
        target,
        outcome,
    };
    state.record(event).await
}

/// The answer that starts a page session: its cookies, then `next`.
fn page_session(tokens: &SessionTokens, next: &str) -> Response {
    let max_age = PAGE_MS / 1000;
    // Browsers keep Secure cookies over https, and over http on localhost only.
    let secure = "; Secure";
    let session =
        format!("{SESSION_COOKIE}={}; Path=/; Max-Age={max_age}; HttpOnly{secure}; SameSite=Lax", tokens.access_token);
    let csrf =
        format!("{CSRF_COOKIE}={}; Path=/; Max-Age={max_age}{secure}; SameSite=Strict", csrf_of(&tokens.access_token));
    let mut response = Redirect::to(next).into_response();
    for c in [session, csrf] {
        if let Ok(v) = HeaderValue::from_str(&c) {
            response.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    response
}

fn message_page(title: &str, text: &str) -> Response {
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t} · Caret</title></head>\
         <body><h1>{t}</h1><p>{m}</p></body></html>",
        t = escape_html(title),
        m = escape_html(text)
    );
    let mut r = Html(body).into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// `GET /v1/auth/device`'s query.
#[derive(Debug, Deserialize)]
pub struct DeviceQuery {
    user_code: Option<String>,
    /// The person confirmed that they started this sign-in.
    confirm: Option<String>,
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// `GET /v1/auth/device`: the page a device's person opens: the code asked for (or taken from
/// the link), confirmed by its person (a link from someone else must not sign them in on that
/// someone's device, RFC 8628 5.4), then off to the provider.
pub async fn device_page(State(state): State<AppState>, Query(q): Query<DeviceQuery>) -> Result<Response> {
    let (sign_in, oidc) = oidc(&state)?;
    let page = |body: String| {
        let html = format!(
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign in a device · Caret</title>\
             </head><body><h1>Sign in a device</h1>{body}</body></html>"
        );
        let mut r = Html(html).into_response();
        r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        r
    };
    let Some(code) = q.user_code.filter(|c| !c.trim().is_empty()) else {
        return Ok(page(
            "<form method=\"get\"><label>The code your device shows <input name=\"user_code\" autocomplete=\"off\" \
             required></label> <button>Continue</button></form>"
                .to_owned(),
        ));
    };
    let identity = state.identity()?;
    let tenant = identity.device_tenant(&code).await?;
    if tenant != organisation(&state, oidc).await? {
        return Err(Error::BadRequest("this code is unknown, used already or expired".into()));
    }
    let user_code = caret_identity::signins::shown_user_code(&caret_identity::signins::normal_user_code(&code));
    if q.confirm.as_deref() != Some("yes") {
        let shown = escape_html(&user_code);
        return Ok(page(format!(
            "<p>A device asks to sign in as you with the code <strong id=\"code\">{shown}</strong>. Continue only if \
             you started this sign-in and the device shows this code.</p><form method=\"get\">\
             <input type=\"hidden\" name=\"user_code\" value=\"{shown}\"><input type=\"hidden\" name=\"confirm\" \
             value=\"yes\"><button id=\"confirm\">Sign in the device</button></form>"
        )));
    }
    to_provider(&state, sign_in, oidc, Purpose::Device { user_code }).await
}

/// `POST /v1/auth/device`: a device's sign-in starts.
pub async fn device_start(State(state): State<AppState>) -> Result<axum::Json<DeviceAuthorization>> {
    let (sign_in, oidc) = oidc(&state)?;
    let start = state.identity()?.start_device(&organisation(&state, oidc).await?).await?;
    let uri = format!("{}/v1/auth/device", sign_in.public_url.trim_end_matches('/'));
    Ok(axum::Json(DeviceAuthorization {
        verification_uri_complete: format!("{uri}?user_code={}", start.user_code),
        verification_uri: uri,
        device_code: start.device_code,
        user_code: start.user_code,
        expires_in: start.expires_in,
        interval: start.interval,
    }))
}

/// `POST /v1/auth/token`'s form (RFC 6749 and 8628).
#[derive(Debug, Deserialize)]
pub struct TokenRequest {
    grant_type: String,
    code: Option<String>,
    code_verifier: Option<String>,
    redirect_uri: Option<String>,
    refresh_token: Option<String>,
    device_code: Option<String>,
}

/// An OAuth error answer (RFC 6749, 5.2).
fn oauth_error(status: StatusCode, code: &str, description: &str) -> Response {
    let body = serde_json::json!({ "error": code, "error_description": description });
    let mut r = (status, axum::Json(body)).into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn granted(tokens: SessionTokens) -> Response {
    let now = caret_identity::db::now_ms();
    let body = TokenResponse {
        access_token: tokens.access_token,
        token_type: "Bearer".into(),
        expires_in: (tokens.expires_at - now).max(0) / 1000,
        refresh_token: tokens.refresh_token,
        email: tokens.user.email,
        organisation: tokens.user.tenant,
    };
    let mut r = axum::Json(body).into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// `POST /v1/auth/token`: a loopback code, a refresh token or a device code for sign-in tokens.
pub async fn token(State(state): State<AppState>, body: axum::body::Bytes) -> Response {
    let req: TokenRequest = match serde_urlencoded::from_bytes(&body) {
        Ok(r) => r,
        Err(e) => return oauth_error(StatusCode::BAD_REQUEST, "invalid_request", &e.to_string()),
    };
    let Ok(identity) = state.identity() else {
        return oauth_error(StatusCode::SERVICE_UNAVAILABLE, "temporarily_unavailable", "no sign-in here");
    };
    let missing = |what: &str| oauth_error(StatusCode::BAD_REQUEST, "invalid_request", &format!("{what} is missing"));
    let result = match req.grant_type.as_str() {
        "authorization_code" => {
            let (Some(code), Some(verifier), Some(redirect)) = (&req.code, &req.code_verifier, &req.redirect_uri)
            else {
                return missing("code, code_verifier or redirect_uri");
            };
            identity.redeem_code(code, verifier, redirect).await
        }
        "refresh_token" => {
            let Some(refresh) = &req.refresh_token else { return missing("refresh_token") };
            identity.refresh(refresh).await
        }
        "urn:ietf:params:oauth:grant-type:device_code" => {
            let Some(device) = &req.device_code else { return missing("device_code") };
            match identity.poll_device(device).await {
                Ok(DevicePoll::Done(tokens)) => Ok(*tokens),
                Ok(DevicePoll::Pending) => {
                    return oauth_error(StatusCode::BAD_REQUEST, "authorization_pending", "nobody has signed in yet");
                }
                Ok(DevicePoll::SlowDown) => {
                    return oauth_error(StatusCode::BAD_REQUEST, "slow_down", "polled faster than the interval");
                }
                Err(e) => Err(e),
            }
        }
        other => {
            return oauth_error(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                &format!("{other:?} is not a grant"),
            );
        }
    };
    match result {
        Ok(tokens) => granted(tokens),
        Err(caret_identity::Error::BadToken(why)) => {
            let code =
                if why.contains("expired") && req.device_code.is_some() { "expired_token" } else { "invalid_grant" };
            oauth_error(StatusCode::BAD_REQUEST, code, &why)
        }
        Err(e) => Error::from(e).into_response(),
    }
}

/// `POST /v1/auth/ldap`: a user name and password checked by the directory (search then
/// bind); tokens, or a page's session. Limited per client address like every token guess.
pub async fn ldap(
    State(state): State<AppState>,
    extensions: axum::http::Extensions,
    crate::state::Json(req): crate::state::Json<caret_protocol::auth::LdapSignIn>,
) -> Result<Response> {
    let none = || Error::NotFound("sign-in through a directory on this server".into());
    let ldap = state.sign_in.as_ref().and_then(|s| s.ldap.clone()).ok_or_else(none)?;
    let identity = state.identity()?.clone();
    let address = crate::state::peer_address(&extensions);
    if let Err(retry_after) = state.limited(crate::state::Limiting::Address, &address).await {
        return Err(Error::RateLimited { retry_after });
    }
    let tenant = organisation_named(&state, &ldap.settings().organisation).await?;
    let checked = async {
        let who = ldap.sign_in(&req.username, &req.password).await.map_err(|e| match e {
            caret_identity::Error::BadToken(why) => Error::SignInRefused(why),
            other => Error::from(other),
        })?;
        let joining = Joining {
            source: "ldap",
            signup: ldap.settings().signup,
            role: ldap.role_of(&who.groups),
            sync_groups: ldap.settings().sync_groups,
        };
        Ok::<_, Error>(identity.signed_in(&tenant, &who, &joining).await?)
    }
    .await;
    recorded(&state, &tenant, &address, "sign_in.ldap", checked.as_ref()).await?;
    let user = checked?;
    if req.page {
        let tokens = identity.issue_session(&tenant, &user, "team page", PAGE_MS, false, None).await?;
        let mut r = page_session(&tokens, "/admin");
        *r.status_mut() = StatusCode::NO_CONTENT;
        r.headers_mut().remove(header::LOCATION);
        return Ok(r);
    }
    let tokens = identity
        .issue_session(&tenant, &user, "sign-in (ldap)", caret_identity::signins::ACCESS_MS, true, None)
        .await?;
    Ok(granted(tokens))
}

/// `POST /v1/auth/logout`: ends the caller's sign-in (every token it gave) and the page's
/// cookies.
pub async fn logout(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Result<Response> {
    let identity = state.identity()?.clone();
    let (tenant, credential) = (caller.tenant.id.clone(), caller.principal.credential.clone());
    state.audited(&caller, "sign_out", "-", async { Ok(identity.sign_out(&tenant, &credential).await?) }).await?;
    let mut r = StatusCode::NO_CONTENT.into_response();
    for name in [SESSION_COOKIE, CSRF_COOKIE] {
        if let Ok(v) = HeaderValue::from_str(&format!("{name}=; Path=/; Max-Age=0")) {
            r.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_redirects_and_local_paths_are_followed() {
        assert!(loopback_redirect("http://127.0.0.1:4242/callback"));
        assert!(loopback_redirect("http://[::1]:4242/callback"));
        for bad in [
            "https://127.0.0.1/x",
            "http://evil.example/cb",
            "http://127.0.0.1.evil.example/cb",
            "http://user@127.0.0.1/cb",
            "http://127.0.0.1/cb#frag",
            "javascript:alert(1)",
        ] {
            assert!(!loopback_redirect(bad), "{bad}");
        }
        assert!(local_path("/admin").is_ok());
        for bad in ["//evil.example", "https://evil.example", "/\\evil", "admin"] {
            assert!(local_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cookies_are_read_from_every_header() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("a=1; caret_session=tok"));
        h.append(header::COOKIE, HeaderValue::from_static("caret_csrf=c"));
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("tok"));
        assert_eq!(cookie(&h, CSRF_COOKIE), Some("c"));
        assert_eq!(cookie(&h, "b"), None);
        assert_ne!(csrf_of("tok"), csrf_of("tok2"));
    }
}
