//! `caret serve` (`caret admin` is `caret_admin`'s).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use caret_server::ServeConfig;
use caret_server::limit::RateLimit;

use caret_host::config::{Config, parse_size};
use caret_host::runtime::{server_runtime, shutdown_signal};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long)]
    addr: Option<String>,
    #[command(flatten)]
    storage: caret_admin::StorageArgs,
    /// PEM certificate chain (enables TLS, with --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve plaintext HTTP on a non-loopback address (only behind a TLS-terminating proxy).
    #[arg(long)]
    allow_insecure_http: bool,
    /// Requests per second allowed per API token.
    #[arg(long)]
    rate_limit: Option<f64>,
    /// Requests a token may make at once after a quiet period.
    #[arg(long)]
    rate_limit_burst: Option<u32>,
    /// Requests per second allowed per client address (every route behind a token, the model
    /// routes included; failed logins count too).
    #[arg(long)]
    ip_rate_limit: Option<f64>,
    /// Requests an address may make at once after a quiet period.
    #[arg(long)]
    ip_rate_limit_burst: Option<u32>,
    /// Largest request body (bytes, or with a K/M/G suffix).
    #[arg(long, value_parser = parse_size)]
    body_limit: Option<u64>,
    /// Worker slots for background runs inside this server (0: runs wait for `caret worker`s).
    #[arg(long, default_value_t = 0)]
    workers: u32,
    /// Where the other replicas on the same database reach this one, e.g.
    /// `http://10.0.0.7:8080` (default: the listening address; loopback when listening on all).
    #[arg(long, env = "CARET_ADVERTISE_URL")]
    advertise_url: Option<String>,
}

pub fn serve(config: &Config, args: ServeArgs) -> anyhow::Result<ExitCode> {
    let mut config = config.clone();
    args.storage.apply(&mut config);
    let worker_slots = args.workers;
    let addr = args.addr.unwrap_or_else(|| config.server.addr.clone());
    let serve = ServeConfig {
        addr: addr.parse().with_context(|| format!("invalid --addr {addr:?}"))?,
        tls: match (args.tls_cert.or(config.server.tls_cert.clone()), args.tls_key.or(config.server.tls_key.clone())) {
            (Some(c), Some(k)) => Some((c, k)),
            _ => None,
        },
        allow_insecure_http: args.allow_insecure_http || config.server.allow_insecure_http,
        rate_limit: RateLimit {
            per_second: args.rate_limit.unwrap_or(config.server.rate_limit_per_second),
            burst: args.rate_limit_burst.unwrap_or(config.server.rate_limit_burst),
        },
        ip_rate_limit: RateLimit {
            per_second: args.ip_rate_limit.unwrap_or(config.server.ip_rate_limit_per_second),
            burst: args.ip_rate_limit_burst.unwrap_or(config.server.ip_rate_limit_burst),
        },
        body_limit: usize::try_from(args.body_limit.unwrap_or(config.server.body_limit.0)).unwrap_or(usize::MAX),
        gateway: config.gateway()?,
        runs: None,
        docs: None,
        pages: None,
        replicas: caret_server::Replicas::Join(args.advertise_url),
        usage: caret_usage::Recorder::off(),
        identity: None,
        sign_in: None,
        agent: caret_server::sessions::AgentSettings {
            workspaces: config.server.agent_workspaces.clone(),
            rules: config.agent.rules(),
            limits: config.agent.limits(),
            max_sessions_per_tenant: config.server.agent_sessions_per_tenant,
            idle_timeout: caret_host::config::parse_duration(&config.server.agent_idle_timeout)
                .context("[server] agent_idle_timeout")?,
            // `caret` is the Landlock helper of its sandboxes.
            landlock_helper: std::env::current_exe().ok(),
            mcp_servers: caret_host::remote::agent_workspace_servers(&config)?,
            image_models: config
                .models
                .iter()
                .filter(|m| config.takes_images(&m.alias))
                .map(|m| m.alias.clone())
                .collect(),
            egress: config.server.egress().context("[server] egress_allow")?,
        },
    };
    serve.check()?;
    let mut serve = serve;
    let storage = config.storage();
    server_runtime()?.block_on(async move {
        let service = caret_host::remote::server_service(&config, &storage).await?;
        let _unloading = service.spawn_unloading(std::time::Duration::from_secs(60));
        serve.identity = Some(Arc::new(caret_server::open_identity(&service).await?));
        serve.usage = config.usage_recorder(service.store().clone())?;
        if serve.usage.is_on() {
            tracing::info!(retention = %config.usage.retention, "usage telemetry: collected (docs/operations.md)");
        }
        let _probes = serve.gateway.as_ref().map(|g| {
            tracing::info!(aliases = ?g.aliases(), "model gateway");
            let every = std::time::Duration::from_secs(5);
            (g.spawn_health_probes(every), caret_server::llm::spawn_recovery_watch(service.clone(), g.clone(), every))
        });
        let runs = Arc::new(
            caret_host::runs::open_service(&config, &service, serve.gateway.clone(), caret_host::runs::Reach::Team)
                .await?,
        );
        serve.runs = Some(runs.clone());
        let docs = caret_library::team::TeamDocs::open(
            caret_host::docs::team_settings(&config)?,
            service.clone(),
            runs.clone(),
        );
        let _docs_upkeep = docs.spawn_upkeep(std::time::Duration::from_secs(60));
        serve.docs = Some(Arc::new(docs));
        let _upkeep = caret_host::runs::spawn_upkeep(runs.clone());
        let (drain_tx, drain) = tokio::sync::watch::channel(false);
        // The editor page of each agent workspace, for the tenants' tokens.
        if !config.server.agent_workspaces.is_empty() {
            serve.pages = Some(caret_ui::pages(&config, serve.gateway.clone(), Some(runs.clone()), drain.clone()));
        }
        let workers = if worker_slots > 0 {
            let worker =
                caret_host::runs::local_worker(&config, runs.clone(), worker_slots, caret_host::runs::Reach::Team)?;
            Some(tokio::spawn(worker.run(drain.clone())))
        } else {
            None
        };
        let listener =
            std::net::TcpListener::bind(serve.addr).with_context(|| format!("listening on {}", serve.addr))?;
        let local = listener.local_addr()?;
        let scheme = if serve.tls.is_some() { "https" } else { "http" };
        serve.sign_in = sign_in(&config, &format!("{scheme}://{local}"))?;
        // Printed for scripts and tests that ask for port 0.
        println!("caret serve listening on {scheme}://{local}");
        for name in config.server.agent_workspaces.keys() {
            tracing::info!(
                "the editor page of workspace {name}: {scheme}://{local}/ui/{name}/ (sign in with an API token)"
            );
        }
        tracing::info!(addr = %local, tls = serve.tls.is_some(), "serving");
        let stopping = async move {
            shutdown_signal().await;
            // Worker slots finish or hand back their runs while the server drains requests.
            let _ = drain_tx.send(true);
        };
        caret_server::serve(service, serve, listener, stopping).await?;
        if let Some(w) = workers {
            match w.await {
                Ok(Ok(summary)) => tracing::info!(?summary, "worker slots stopped"),
                Ok(Err(e)) => tracing::warn!("worker slots: {e}"),
                Err(e) => tracing::warn!("worker slots: {e}"),
            }
        }
        tracing::info!("stopped");
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// How people sign in: the OpenID Connect provider of `[server.oidc]` and the directory of
/// `[server.ldap]`, redirects under `[server] public_url` (`listening`, the address listened
/// on, when unset).
fn sign_in(config: &Config, listening: &str) -> anyhow::Result<Option<Arc<caret_server::signin::SignIn>>> {
    let (oidc, ldap) = (config.server.oidc.clone(), config.server.ldap.clone());
    if oidc.is_none() && ldap.is_none() {
        return Ok(None);
    }
    let public_url = config.server.public_url.clone().unwrap_or_else(|| listening.to_owned());
    let mut sign_in = caret_server::signin::SignIn::new(public_url);
    if let Some(settings) = oidc {
        sign_in = sign_in.and_oidc(settings).context("[server.oidc]")?;
    }
    if let Some(settings) = ldap {
        sign_in = sign_in.and_ldap(settings).context("[server.ldap]")?;
    }
    Ok(Some(Arc::new(sign_in)))
}
