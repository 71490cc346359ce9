//! The Caret server: HTTP routes, authentication, tenancy, rate limits and the wiring of
//! services. Business logic lives in the services it wires (`caret-index`, `caret-anyrun`,
//! `caret-identity`, `caret-models`, `caret-sessions`, `caret-complete`, `caret-apply`);
//! routes only translate HTTP.
//!
//! The server never writes plaintext code or real file names anywhere: it receives
//! obfuscated paths, keyed hashes and, for chunks it lacks, texts that it holds in memory
//! while computing their keyed terms.

pub mod admin;
pub mod agent;
pub mod cluster;
pub mod compartment;
pub mod docs;
pub mod docs_library;
pub mod http;
pub mod limit;
pub mod llm;
pub mod mcp;
pub mod metrics;
/// The API's description (its own crate).
pub use caret_openapi as openapi;
pub mod runs;
pub mod scim;
pub mod settings;
pub mod signin;
pub mod spend;
pub mod sse;
pub mod state;
pub mod tab;

/// The agent sessions the server hosts (`caret-sessions`).
pub use caret_sessions as sessions;

mod error;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use caret_index::{Service, StorageConfig};
pub use error::{Error, Result};

use crate::limit::{Limiter, RateLimit};

/// The run service on the same database and object store as `service`, with the runs'
/// master key from `key_file` (created on first use, mode 0600) unless `CARET_RUNS_KEY`
/// holds one (every replica of a team's server must share it).
pub async fn open_runs(
    service: &Service,
    storage: &StorageConfig,
    key_file: &Path,
    gateway: Option<Arc<caret_models::Gateway>>,
    settings: caret_anyrun::runs::RunSettings,
) -> Result<caret_anyrun::runs::RunService> {
    use caret_crypto::WorkspaceKey;
    let key = match std::env::var("CARET_RUNS_KEY") {
        Ok(text) if !text.trim().is_empty() => {
            WorkspaceKey::import(&text).map_err(|e| Error::BadRequest(format!("CARET_RUNS_KEY: {e}")))?
        }
        _ if key_file.exists() => {
            WorkspaceKey::load(key_file).map_err(|source| Error::Key { what: "reading the runs' key", source })?
        }
        _ => {
            let key = WorkspaceKey::generate().map_err(|source| Error::Key { what: "making the runs' key", source })?;
            match key.save_new(key_file) {
                Ok(()) => key,
                // Another process made it first: use theirs.
                Err(_) if key_file.exists() => WorkspaceKey::load(key_file)
                    .map_err(|source| Error::Key { what: "reading the runs' key", source })?,
                Err(source) => return Err(Error::Key { what: "saving the runs' key", source }),
            }
        }
    };
    let dialect = caret_anyrun::queue::Dialect::of_url(&storage.database_url);
    let queue = caret_anyrun::queue::Queue::open(service.db().pool().clone(), dialect).await?;
    Ok(caret_anyrun::runs::RunService::new(queue, service.store().clone(), key, gateway, settings))
}

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// PEM certificate chain and private key for TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Serve plaintext HTTP on a non-loopback address (code would cross the network in clear).
    pub allow_insecure_http: bool,
    /// Rate limit per person (all their tokens), or per token of a service account.
    pub rate_limit: RateLimit,
    /// Per-client-address rate limit (the TCP peer: behind a proxy, the proxy's address).
    pub ip_rate_limit: RateLimit,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// The model gateway behind `/v1/chat/completions` and friends (none: those answer 503).
    pub gateway: Option<Arc<caret_models::Gateway>>,
    /// Agent sessions: their workspaces (none: `/v1/agent/...` answers 503), rules, limits.
    pub agent: sessions::AgentSettings,
    /// Background runs (none: `/v1/runs` answers 503).
    pub runs: Option<Arc<caret_anyrun::runs::RunService>>,
    /// Documentation sources (none: `/v1/docs/...` answers 503).
    pub docs: Option<Arc<dyn docs_library::DocsLibrary>>,
    /// A front end served under `/ui` (the team's editor page), when there is one.
    pub pages: Option<Pages>,
    /// Whether this server joins the replicas on its database.
    pub replicas: Replicas,
    /// Opt-in usage telemetry (off: [`caret_usage::Recorder::off`]).
    pub usage: caret_usage::Recorder,
    /// People, credentials and the audit trail (none: tenant tokens only, no admin API).
    pub identity: Option<Arc<caret_identity::Identity>>,
    /// How people sign in (none: with tokens only).
    pub sign_in: Option<Arc<signin::SignIn>>,
}

/// The identity store on `service`'s metadata database.
pub async fn open_identity(service: &Service) -> Result<caret_identity::Identity> {
    Ok(caret_identity::Identity::open(service.db().pool().clone(), service.db().dialect()).await?)
}

/// Whether a server is one of several replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replicas {
    /// Joins the replicas on its database, reachable by them at this URL
    /// (`http://10.0.0.7:8080`; none: the listener's address, loopback when it listens on all).
    Join(Option<String>),
    /// One process by construction (the local daemon): no heartbeats, flag reloads or shared
    /// limits against a database that the user's other commands write too.
    Alone,
}

/// A front end served under `/ui` beside the API. `public` holds no data and needs no token
/// (the page and its scripts); `tenant` runs behind the same checks as `/v1` (token, rate
/// limits) and finds the caller's [`db::Tenant`] in the request's extensions. Paths are
/// relative to `/ui`.
#[derive(Clone, Default)]
pub struct Pages {
    /// Static files.
    pub public: axum::Router,
    /// Everything that reads or changes data.
    pub tenant: axum::Router,
}

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pages")
    }
}

impl ServeConfig {
    /// Refuses plaintext HTTP on a non-loopback address unless explicitly allowed.
    pub fn check(&self) -> Result<()> {
        if self.tls.is_none() && !self.addr.ip().is_loopback() && !self.allow_insecure_http {
            return Err(Error::BadRequest(format!(
                "refusing to serve plaintext HTTP on {}: code would cross the network unencrypted; \
                 give --tls-cert and --tls-key, or --allow-insecure-http if a TLS proxy is in front",
                self.addr
            )));
        }
        Ok(())
    }
}

/// Builds the router for a service.
pub fn app(service: Arc<Service>, config: &ServeConfig) -> axum::Router {
    let state = app_state(service, config, Arc::new(tokio::sync::watch::channel(false).0), None, None);
    http::router(state, config.body_limit, config.pages.clone())
}

/// The routes' state; event streams end when `stopping` turns true.
fn app_state(
    service: Arc<Service>,
    config: &ServeConfig,
    stopping: Arc<tokio::sync::watch::Sender<bool>>,
    cluster: Option<Arc<cluster::Cluster>>,
    compartments: Option<compartment::Compartments>,
) -> state::AppState {
    // Runs' model calls count for the person who submitted them; their owners go with them.
    if let (Some(runs), Some(identity)) = (&config.runs, &config.identity) {
        runs.set_people(Arc::new(spend::RunPeople { identity: identity.clone() }));
    }
    state::AppState {
        service,
        limiter: Arc::new(Limiter::new(config.rate_limit)),
        ip_limiter: Arc::new(Limiter::new(config.ip_rate_limit)),
        metrics: Arc::new(metrics::Metrics::default()),
        gateway: config.gateway.clone(),
        agent: (!config.agent.workspaces.is_empty())
            .then(|| Arc::new(sessions::AgentHost::new(config.agent.clone(), config.usage.clone()))),
        runs: config.runs.clone(),
        docs: config.docs.clone(),
        stopping,
        cluster,
        compartments,
        usage: config.usage.clone(),
        identity: config.identity.clone(),
        sign_in: config.sign_in.clone(),
        credentials: Arc::new(caret_identity::cache::Cache::new(std::time::Duration::from_secs(60), 100_000)),
    }
}

/// Every moment while serving: this replica's heartbeat, flags, shared limits, and the
/// deployments switched off in the gateway.
async fn tick(state: state::AppState) {
    let Some(cluster) = state.cluster.clone() else { return };
    let mut n: u32 = 0;
    loop {
        tokio::time::sleep(cluster::TICK).await;
        let limiters = [("token", state.limiter.as_ref()), ("ip", state.ip_limiter.as_ref())];
        if let Err(e) = cluster.tick(n, &limiters).await {
            tracing::warn!(error = %error::chain(&e), "keeping in step with the other replicas");
        }
        // A revocation anywhere empties every replica's credential cache.
        if let Some(identity) = &state.identity {
            match identity.epoch().await {
                Ok(epoch) => state.credentials.observe(epoch),
                Err(e) => tracing::warn!(error = %error::chain(&e), "reading the identity epoch"),
            }
        }
        if let Some(gateway) = &state.gateway {
            let flags = cluster.flags();
            let off = gateway
                .deployment_names()
                .into_iter()
                .filter(|d| !flags.allows(&format!("deployment.{d}"), None))
                .collect();
            gateway.switch_off(off);
        }
        n = n.wrapping_add(1);
    }
}

/// Every few minutes, the audit trail's closed hours not yet on the object store (any replica
/// may write an hour: they write the same records).
async fn export_audit(identity: Arc<caret_identity::Identity>, service: Arc<Service>) {
    loop {
        match identity.export_audit(service.store().as_ref()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(hours = n, "audit trail exported"),
            Err(e) => tracing::warn!(error = %error::chain(&e), "exporting the audit trail"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(300)).await;
    }
}

/// Where the other replicas reach this one, when the operator did not say.
fn default_url(listener: &std::net::TcpListener, tls: bool) -> Result<String> {
    let addr = listener.local_addr().map_err(|source| Error::Io { what: "reading the listener's address", source })?;
    let scheme = if tls { "https" } else { "http" };
    if addr.ip().is_unspecified() {
        tracing::warn!(
            "listening on every address without --advertise-url: other replicas are told 127.0.0.1, \
             which only works when all run on this machine"
        );
        return Ok(format!("{scheme}://127.0.0.1:{}", addr.port()));
    }
    Ok(format!("{scheme}://{addr}"))
}

/// How long connections may take to finish once the server stops.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves until `shutdown` resolves, then drains in-flight requests (event streams end at
/// once; anything else has [`DRAIN`]).
pub async fn serve(
    service: Arc<Service>,
    config: ServeConfig,
    listener: std::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    config.check()?;
    let stopping = Arc::new(tokio::sync::watch::channel(false).0);
    let cluster = match &config.replicas {
        Replicas::Alone => None,
        Replicas::Join(advertise) => {
            let url = match advertise {
                Some(url) => url.clone(),
                None => default_url(&listener, config.tls.is_some())?,
            };
            let cluster = Arc::new(cluster::Cluster::join(service.db().clone(), url).await?);
            if let Some(runs) = &config.runs {
                runs.set_placement(cluster.clone());
            }
            if let Some(gateway) = &config.gateway {
                gateway.set_quota_ledger(cluster.clone());
            }
            Some(cluster)
        }
    };
    let compartments = compartment::Compartments::standard()?;
    let state = app_state(service, &config, stopping.clone(), cluster.clone(), Some(compartments));
    let ticking = tokio::spawn(tick(state.clone()));
    let exporting = state.identity.clone().map(|identity| tokio::spawn(export_audit(identity, state.service.clone())));
    if let Some(runs) = &config.runs {
        runs.metrics.set_usage(config.usage.clone());
    }
    let usage = config.usage.clone();
    let flushing = usage.spawn();
    let app = http::router(state, config.body_limit, config.pages.clone());
    let mut stopped = stopping.subscribe();
    let shutdown = async move {
        shutdown.await;
        // The others stop sending requests here first; then the streams end and the rest drains.
        ticking.abort();
        if let Some(e) = exporting {
            e.abort();
        }
        if let Some(cluster) = cluster {
            cluster.leave().await;
        }
        stopping.send_replace(true);
    };
    listener.set_nonblocking(true).map_err(|source| Error::Io { what: "configuring the listener", source })?;
    let served = match &config.tls {
        Some((cert, key)) => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let tls = axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key)
                .await
                .map_err(|e| Error::BadRequest(format!("loading TLS certificate {}: {e}", cert.display())))?;
            let handle = axum_server::Handle::new();
            let h = handle.clone();
            tokio::spawn(async move {
                shutdown.await;
                h.graceful_shutdown(Some(DRAIN));
            });
            axum_server::from_tcp_rustls(listener, tls)
                .handle(handle)
                .serve(app.into_make_service_with_connect_info::<SocketAddr>())
                .await
                .map_err(|source| Error::Io { what: "serving", source })
        }
        None => {
            let listener = tokio::net::TcpListener::from_std(listener)
                .map_err(|source| Error::Io { what: "configuring the listener", source })?;
            let serving = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(shutdown);
            let drained = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
                tokio::time::sleep(DRAIN).await;
            };
            tokio::select! {
                served = serving => served.map_err(|source| Error::Io { what: "serving", source }),
                () = drained => {
                    tracing::warn!("connections still open {DRAIN:?} after the stop: closing them");
                    Ok(())
                }
            }
        }
    };
    // The usage sums since the last flush are written before the process goes.
    if let Some(task) = flushing {
        task.abort();
        if let Err(e) = usage.flush().await {
            tracing::warn!("usage: the last sums were not written: {e}");
        }
    }
    served
}
