//! What every route shares: [`AppState`] (the services, limiters, metrics and the stop
//! signal) and the extractors whose rejections answer in Caret's error body. Handlers import
//! this; the router (`http`) imports the handlers.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use caret_index::Service;

use crate::limit::Limiter;
use crate::metrics::Metrics;
use crate::sessions::AgentHost;

/// Shared state of the routes.
#[derive(Clone)]
pub struct AppState {
    /// The sync service.
    pub service: Arc<Service>,
    /// Rate limits per person (all their tokens), or per token of a service account.
    pub limiter: Arc<Limiter>,
    /// Per-client-address rate limits.
    pub ip_limiter: Arc<Limiter>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The model gateway, when models are configured.
    pub gateway: Option<Arc<caret_models::Gateway>>,
    /// Agent sessions, when agent workspaces are configured.
    pub agent: Option<Arc<AgentHost>>,
    /// Background runs, when enabled.
    pub runs: Option<Arc<caret_anyrun::runs::RunService>>,
    /// Documentation sources, when enabled.
    pub docs: Option<Arc<dyn crate::docs_library::DocsLibrary>>,
    /// Turns true when the server stops: event streams end.
    pub stopping: Arc<tokio::sync::watch::Sender<bool>>,
    /// This replica among the others on the database (none: a router built without serving,
    /// as tests do: no flags, no routing).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// The heavy capabilities' own pools (none: everything on the server's runtime).
    pub compartments: Option<crate::compartment::Compartments>,
    /// Opt-in usage telemetry.
    pub usage: caret_usage::Recorder,
    /// People, credentials and the audit trail (none: tenant tokens only, no admin API — the
    /// local daemon, a router built for a test).
    pub identity: Option<Arc<caret_identity::Identity>>,
    /// How people sign in (none: tokens only).
    pub sign_in: Option<Arc<SignIn>>,
    /// Checked credentials, by token hash, for one identity epoch.
    pub credentials: Arc<caret_identity::cache::Cache<Caller>>,
}

/// How people sign in on this server.
#[derive(Debug, Clone)]
pub struct SignIn {
    /// Where this server is reached from browsers (`https://caret.acme.example`): the
    /// provider's redirect goes to `/v1/auth/callback` under it.
    pub public_url: String,
    /// The OpenID Connect provider, when configured.
    pub oidc: Option<Arc<caret_identity::oidc::Oidc>>,
    /// The LDAP directory, when configured.
    pub ldap: Option<Arc<caret_identity::ldap::Ldap>>,
}

impl SignIn {
    /// No way to sign in yet; redirects come back under `public_url`.
    pub fn new(public_url: String) -> SignIn {
        SignIn { public_url, oidc: None, ldap: None }
    }

    /// Signing in with the OpenID Connect provider of `settings` too.
    pub fn and_oidc(mut self, settings: caret_identity::oidc::OidcSettings) -> crate::Result<SignIn> {
        self.oidc = Some(Arc::new(caret_identity::oidc::Oidc::new(settings)?));
        Ok(self)
    }

    /// Signing in with the directory of `settings` too.
    pub fn and_ldap(mut self, settings: caret_identity::ldap::LdapSettings) -> crate::Result<SignIn> {
        self.ldap = Some(Arc::new(caret_identity::ldap::Ldap::new(settings)?));
        Ok(self)
    }

    pub(crate) fn callback(&self) -> String {
        format!("{}/v1/auth/callback", self.public_url.trim_end_matches('/'))
    }
}

/// The client's address (the TCP peer), for limits and the audit trail; `-` where the router
/// was served without it (a test's).
pub(crate) fn peer_address(extensions: &axum::http::Extensions) -> String {
    extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map_or_else(|| "-".to_owned(), |c| c.0.ip().to_string())
}

/// Which rate limit.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Limiting {
    /// Per person, or per token of a service account.
    Token,
    /// Per client address.
    Address,
}

/// Who a request acts as, set by the authentication layer beside its [`caret_index::Tenant`].
#[derive(Debug, Clone)]
pub struct Caller {
    /// The organisation.
    pub tenant: caret_index::Tenant,
    /// The person or service account, role and scopes.
    pub principal: caret_identity::Principal,
    /// The client's address (the TCP peer), for the audit trail.
    pub address: String,
    /// The model aliases the person's groups allow (none: unrestricted).
    pub models: Option<Arc<std::collections::BTreeSet<String>>>,
    /// The person's daily budget of model tokens (none: unlimited).
    pub budget: Option<i64>,
}

impl Caller {
    /// Refuses unless the caller's role is at least `role`.
    pub fn at_least(&self, role: caret_identity::Role) -> crate::Result<()> {
        if self.principal.role >= role {
            return Ok(());
        }
        Err(crate::Error::Forbidden("forbidden", format!("this needs the {} role", role.name())))
    }
}

impl AppState {
    /// The identity store, or 503 where this server has none.
    pub fn identity(&self) -> crate::Result<&Arc<caret_identity::Identity>> {
        self.identity.as_ref().ok_or_else(|| crate::Error::Unavailable("this server keeps no people or tokens".into()))
    }

    /// Refuses with `missing()` (exactly as a missing one answers) another person's resource
    /// of `kind` that is not shared with the organisation; an admin reaches every one, and
    /// resources of service accounts and the server are the organisation's.
    pub async fn visible(
        &self,
        caller: &Caller,
        kind: &str,
        id: &str,
        missing: impl FnOnce() -> crate::Error,
    ) -> crate::Result<()> {
        let Some(identity) = self.identity.as_ref().filter(|_| caller.principal.role < caret_identity::Role::Admin)
        else {
            return Ok(());
        };
        match identity.owner(&caller.tenant.id, kind, id).await? {
            Some(o) if !o.shared && caller.principal.user.as_ref() != Some(&o.user) => Err(missing()),
            _ => Ok(()),
        }
    }

    /// Records that the caller's person (if any) made `tenant`'s resource `id` of `kind`.
    pub async fn own(&self, caller: &Caller, kind: &str, id: &str) -> crate::Result<()> {
        if let (Some(identity), Some(user)) = (&self.identity, &caller.principal.user) {
            identity.own(&caller.tenant.id, kind, id, user).await?;
        }
        Ok(())
    }

    /// Runs `change`, writes its outcome to the audit trail, then answers with it.
    pub async fn audited<T>(
        &self,
        caller: &Caller,
        action: &str,
        target: &str,
        change: impl std::future::Future<Output = crate::Result<T>>,
    ) -> crate::Result<T> {
        let result = change.await;
        let outcome = match &result {
            Ok(_) => "ok".to_owned(),
            Err(e) => format!("failed: {}", e.status().1),
        };
        self.audit(caller, action, target, &outcome).await?;
        result
    }

    /// Appends to the audit trail before the answer goes out (nothing where there is no
    /// identity store). A failure to record fails the request.
    pub async fn audit(&self, caller: &Caller, action: &str, target: &str, outcome: &str) -> crate::Result<()> {
        self.record(caret_identity::audit::Event {
            tenant: caller.tenant.id.clone(),
            actor: caller.principal.actor(),
            address: caller.address.clone(),
            action: action.to_owned(),
            target: target.to_owned(),
            outcome: outcome.to_owned(),
        })
        .await
    }

    /// Appends `event` to the audit trail (nothing where there is no identity store).
    pub async fn record(&self, event: caret_identity::audit::Event) -> crate::Result<()> {
        if let Some(identity) = &self.identity {
            identity.audit(event).await?;
        }
        Ok(())
    }

    /// Takes one request from `key`'s bucket: this replica's alone, or shared with the others.
    pub(crate) async fn limited(&self, which: Limiting, key: &str) -> Result<(), u64> {
        let (limiter, scope) = match which {
            Limiting::Token => (&self.limiter, "token"),
            Limiting::Address => (&self.ip_limiter, "ip"),
        };
        match &self.cluster {
            Some(cluster) => cluster.admit(limiter, scope, key).await,
            None => limiter.check(key, std::time::Instant::now()),
        }
    }

    /// Refuses with 503 `disabled` when flag `name` is off for `tenant`.
    pub fn allowed(&self, name: &str, tenant: Option<&str>) -> crate::Result<()> {
        match &self.cluster {
            Some(c) if !c.flags().allows(name, tenant) => Err(crate::Error::Disabled(name.to_owned())),
            _ => Ok(()),
        }
    }
}

/// The scope a route needs: the API description's rule.
pub use caret_openapi::scope;

/// A refusal in our error body.
pub(crate) fn refusal(status: StatusCode, message: String) -> Response {
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        // An extractor's own bug (a route without the parameters it reads).
        s if s.is_server_error() => "internal",
        _ => "bad_request",
    };
    let body = caret_protocol::ErrorBody { error: caret_protocol::ErrorDetail { code: code.to_owned(), message } };
    (status, axum::Json(body)).into_response()
}

/// JSON bodies whose rejections (malformed, truncated, wrong type, too large) become our
/// error body with a 4xx status.
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(rejection) => {
                let message = match &rejection {
                    JsonRejection::JsonDataError(e) => format!("invalid request body: {}", e.body_text()),
                    JsonRejection::JsonSyntaxError(e) => format!("malformed JSON: {}", e.body_text()),
                    JsonRejection::MissingJsonContentType(_) => "expected Content-Type: application/json".to_owned(),
                    other => other.body_text(),
                };
                Err(refusal(rejection.status(), message))
            }
        }
    }
}

/// Query strings whose rejections become our error body (400).
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(rejection) => Err(refusal(rejection.status(), rejection.body_text())),
        }
    }
}

/// Path parameters whose rejections (a token that is not a number, say) become our error
/// body (400).
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(rejection) => Err(refusal(rejection.status(), rejection.body_text())),
        }
    }
}
