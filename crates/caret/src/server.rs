//! `caret serve` and `caret admin`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use caret_index::StorageConfig;
use caret_server::ServeConfig;
use caret_server::limit::RateLimit;

use caret_host::config::{Config, parse_size};
use caret_host::runtime::{runtime, shutdown_signal};

/// Where the server keeps its data (shared by `serve` and `admin`).
#[derive(Debug, clap::Args)]
pub struct StorageArgs {
    /// Data directory (SQLite file and local objects by default); default $CARET_HOME/server.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// `sqlite://FILE` or `postgres://…` (env CARET_DATABASE_URL).
    #[arg(long)]
    database_url: Option<String>,
    /// A directory, or `s3://bucket/prefix` with AWS_* settings from the environment
    /// (env CARET_OBJECT_STORE).
    #[arg(long)]
    object_store: Option<String>,
}

impl StorageArgs {
    fn apply(&self, config: &mut Config) {
        if let Some(d) = &self.data_dir {
            config.server.data_dir = Some(d.clone());
        }
        if let Some(u) = &self.database_url {
            config.server.database_url = Some(u.clone());
        }
        if let Some(o) = &self.object_store {
            config.server.object_store = Some(o.clone());
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long)]
    addr: Option<String>,
    #[command(flatten)]
    storage: StorageArgs,
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
    runtime()?.block_on(async move {
        let service = caret_host::remote::server_service(&config, &storage).await?;
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
        let docs = caret_host::team_docs::TeamDocs::open(&config, service.clone(), runs.clone());
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

#[derive(Debug, clap::Subcommand)]
pub enum AdminCommand {
    /// Tenants.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Operator tokens: for `caret worker` processes and the fleet dashboard.
    #[command(subcommand)]
    OperatorToken(OperatorTokenCommand),
    /// Recovery admission of the model gateway: after an incident, admit a stable share of
    /// tenants that widens over time, on every replica.
    #[command(subcommand)]
    Recovery(RecoveryCommand),
    /// Feature flags and kill switches, per capability (`sync`, `embedding`, `search.hybrid`,
    /// `search.lexical`, `search.semantic`, `tab`, `apply`, `agent`, `runs`, `rollouts`,
    /// `model.<alias>`, `deployment.<name>`, `experiment.<name>`): every replica applies a
    /// change within a second or two, without a restart.
    #[command(subcommand)]
    Flags(FlagsCommand),
    /// Usage telemetry (when `[usage] collect` is on): counts, failures and latencies per
    /// tenant, event and label, from the hourly files in the object store.
    Usage {
        /// Only this tenant (by name).
        #[arg(long)]
        tenant: Option<String>,
        /// From when: a span back from now (`90m`, `24h`, `7d`) or an hour or day UTC
        /// (`2026-11-26T15`, `2026-11-26`).
        #[arg(long, default_value = "7d")]
        since: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        storage: StorageArgs,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum FlagsCommand {
    /// Set a flag on or off, for every tenant or one, for all or a percentage of tenants.
    Set {
        /// The flag.
        name: String,
        /// `on` or `off`.
        state: String,
        /// Only this tenant (by name); its rule wins over the rule for all.
        #[arg(long)]
        tenant: Option<String>,
        /// The share of tenants (0-100, by a stable hash) the state applies to; the rest get
        /// the opposite.
        #[arg(long, default_value_t = 100)]
        percent: u8,
        /// Why (kept for operators).
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        storage: StorageArgs,
    },
    /// The rules in force.
    List {
        /// As JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        storage: StorageArgs,
    },
    /// Remove a flag's rule (for every tenant, or one): back to the default.
    Clear {
        /// The flag.
        name: String,
        /// Only this tenant's rule (by name).
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        storage: StorageArgs,
    },
}

/// A tenant's id by its name.
async fn tenant_id(db: &caret_index::Db, name: Option<&str>) -> anyhow::Result<Option<String>> {
    let Some(name) = name else { return Ok(None) };
    let t = db.tenant_by_name(name).await?.with_context(|| format!("no tenant named {name}"))?;
    Ok(Some(t.id))
}

#[derive(Debug, clap::Subcommand)]
pub enum RecoveryCommand {
    /// Start (or restart) it.
    Start {
        /// Share of tenants admitted at once (0 to 1).
        #[arg(long, default_value_t = 0.1)]
        from: f64,
        /// Seconds until every tenant is admitted.
        #[arg(long, default_value_t = 600)]
        ramp_s: u64,
        #[command(flatten)]
        storage: StorageArgs,
    },
    /// End it: admit everyone now.
    Stop {
        #[command(flatten)]
        storage: StorageArgs,
    },
    /// Whether it is on, and the share admitted now.
    Status {
        #[command(flatten)]
        storage: StorageArgs,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum OperatorTokenCommand {
    /// Create one; it is printed once and only its hash is stored.
    Create {
        /// A label for the token.
        #[arg(long, default_value = "operator")]
        name: String,
        #[command(flatten)]
        storage: StorageArgs,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum TenantCommand {
    /// Create a tenant.
    Create {
        /// Its name.
        name: String,
        #[command(flatten)]
        storage: StorageArgs,
    },
    /// List tenants.
    List {
        #[command(flatten)]
        storage: StorageArgs,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Create an API token for a tenant; it is printed once and only its hash is stored.
    Create {
        /// The tenant's name.
        #[arg(long)]
        tenant: String,
        /// A label for the token.
        #[arg(long, default_value = "default")]
        name: String,
        #[command(flatten)]
        storage: StorageArgs,
    },
}

pub fn admin(config: &Config, cmd: AdminCommand) -> anyhow::Result<ExitCode> {
    let storage_of = |args: &StorageArgs| -> StorageConfig {
        let mut c = config.clone();
        args.apply(&mut c);
        c.storage()
    };
    runtime()?.block_on(async {
        match cmd {
            AdminCommand::Tenant(TenantCommand::Create { name, storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                let t = service.db().create_tenant(&name).await?;
                println!("created tenant {} ({})", t.name, t.id);
            }
            AdminCommand::Tenant(TenantCommand::List { storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                for t in service.db().tenants().await? {
                    println!("{}\t{}", t.name, t.id);
                }
            }
            AdminCommand::Token(TokenCommand::Create { tenant, name, storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                let t =
                    service.db().tenant_by_name(&tenant).await?.with_context(|| format!("no tenant named {tenant}"))?;
                println!("{}", service.db().create_token(&t, &name).await?);
                eprintln!("(shown once: only its hash is stored)");
            }
            AdminCommand::OperatorToken(OperatorTokenCommand::Create { name, storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                println!("{}", service.db().create_operator_token(&name).await?);
                eprintln!("(shown once: only its hash is stored; it lets workers take any tenant's runs)");
            }
            AdminCommand::Recovery(RecoveryCommand::Start { from, ramp_s, storage }) => {
                anyhow::ensure!((0.0..=1.0).contains(&from), "--from is a share between 0 and 1, not {from}");
                let service = caret_index::open(&storage_of(&storage)).await?;
                let permille = (from * 1000.0).round() as i64;
                service.db().start_recovery(permille, i64::try_from(ramp_s).unwrap_or(i64::MAX)).await?;
                println!(
                    "recovery admission on: {:.1}% of tenants now, all in {ramp_s} s (servers pick it up within 5 s)",
                    from * 100.0
                );
            }
            AdminCommand::Flags(FlagsCommand::Set { name, state, tenant, percent, reason, storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                let tenant_id = tenant_id(service.db(), tenant.as_deref()).await?;
                let rule = caret_index::flags::Rule {
                    name: name.clone(),
                    tenant: tenant_id,
                    state: caret_index::flags::State::parse(&state)?,
                    percent,
                    reason,
                };
                service.db().set_flag(&rule).await?;
                let whom = tenant.map_or_else(|| "every tenant".to_owned(), |t| format!("tenant {t}"));
                let share = if percent >= 100 { String::new() } else { format!(" ({percent}% of them)") };
                println!("{name} {state} for {whom}{share}; servers apply it within 2 s");
            }
            AdminCommand::Flags(FlagsCommand::List { json, storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                let names: std::collections::HashMap<String, String> =
                    service.db().tenants().await?.into_iter().map(|t| (t.id, t.name)).collect();
                let flags = service.db().flags().await?;
                let rows: Vec<serde_json::Value> = flags
                    .rules()
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "name": r.name,
                            "tenant": r.tenant.as_ref().map(|id| names.get(id).cloned().unwrap_or_else(|| id.clone())),
                            "state": r.state.as_str(),
                            "percent": r.percent,
                            "reason": r.reason,
                        })
                    })
                    .collect();
                if json {
                    println!("{}", serde_json::to_string_pretty(&rows)?);
                } else if rows.is_empty() {
                    println!("no rules: capabilities on, experiments off");
                } else {
                    for r in &rows {
                        println!(
                            "{}\t{}\t{}\t{}%\t{}",
                            r["name"].as_str().unwrap_or(""),
                            r["tenant"].as_str().unwrap_or("(all)"),
                            r["state"].as_str().unwrap_or(""),
                            r["percent"],
                            r["reason"].as_str().unwrap_or("")
                        );
                    }
                }
            }
            AdminCommand::Flags(FlagsCommand::Clear { name, tenant, storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                let tenant_id = tenant_id(service.db(), tenant.as_deref()).await?;
                let had = service.db().clear_flag(&name, tenant_id.as_deref()).await?;
                println!("{}", if had { format!("{name}: rule removed") } else { format!("{name}: no such rule") });
            }
            AdminCommand::Usage { tenant, since, json, storage } => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                usage_report(&service, tenant.as_deref(), &since, json).await?;
            }
            AdminCommand::Recovery(RecoveryCommand::Stop { storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                service.db().stop_recovery().await?;
                println!("recovery admission off: every tenant is admitted");
            }
            AdminCommand::Recovery(RecoveryCommand::Status { storage }) => {
                let service = caret_index::open(&storage_of(&storage)).await?;
                match service.db().recovery().await? {
                    None => println!("off"),
                    Some(r) => {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs() as i64);
                        let elapsed = std::time::Duration::from_secs((now - r.started_at).max(0) as u64);
                        let ramp = std::time::Duration::from_secs(r.ramp_s.max(0) as u64);
                        let share = caret_models::recovery_share(r.from_permille as f64 / 1000.0, ramp, elapsed);
                        println!(
                            "on for {} s: {:.1}% of tenants admitted (ramp {} s)",
                            elapsed.as_secs(),
                            share * 100.0,
                            r.ramp_s
                        );
                    }
                }
            }
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `caret admin usage`: the usage files' figures, per tenant (by name), event and label.
async fn usage_report(
    service: &caret_index::service::Service,
    tenant: Option<&str>,
    since: &str,
    json: bool,
) -> anyhow::Result<()> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
    let since_hour = caret_usage::parse_since(since, now).map_err(anyhow::Error::msg)?;
    let tenant_id = tenant_id(service.db(), tenant).await?;
    let read = caret_usage::read(service.store().as_ref(), tenant_id.as_deref(), since_hour).await?;
    let names: std::collections::HashMap<String, String> =
        service.db().tenants().await?.into_iter().map(|t| (t.id, t.name)).collect();
    let name_of = |id: &str| names.get(id).cloned().unwrap_or_else(|| id.to_owned());
    let summary = caret_usage::summarise(&read.rows);
    // Tab suggestions and next edits accepted of those shown, per tenant.
    let acceptance = |kind: &str| {
        let mut by: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for s in &summary {
            let e = by.entry(name_of(&s.tenant)).or_default();
            match s.event.strip_prefix(kind) {
                Some(".shown") => e.0 += s.count,
                Some(".accepted") => e.1 += s.count,
                _ => {}
            }
        }
        by.retain(|_, (shown, _)| *shown > 0);
        by
    };
    let (tab, next_edit) = (acceptance("tab"), acceptance("next_edit"));
    for why in &read.skipped {
        eprintln!("skipped: {why}");
    }
    if json {
        let rows: Vec<serde_json::Value> = summary
            .iter()
            .map(|s| {
                let mut v = serde_json::to_value(s).unwrap_or_default();
                v["tenant"] = serde_json::Value::String(name_of(&s.tenant));
                v
            })
            .collect();
        let rates =
            |by: &std::collections::BTreeMap<String, (u64, u64)>| -> serde_json::Map<String, serde_json::Value> {
                by.iter()
                    .map(|(t, (shown, accepted))| {
                        let rate = *accepted as f64 / *shown as f64;
                        (t.clone(), serde_json::json!({"shown": shown, "accepted": accepted, "rate": rate}))
                    })
                    .collect()
            };
        let out = serde_json::json!({
            "since": caret_usage::hour_name(since_hour),
            "files": read.files,
            "skipped": read.skipped,
            "rows": rows,
            "tab_acceptance": rates(&tab),
            "next_edit_acceptance": rates(&next_edit),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    if summary.is_empty() {
        println!(
            "no usage since {} UTC ({} files): is `[usage] collect` on (CARET_USAGE_COLLECT=on)?",
            caret_usage::hour_name(since_hour),
            read.files
        );
        return Ok(());
    }
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0}"));
    println!("since {} UTC, from {} files", caret_usage::hour_name(since_hour), read.files);
    println!(
        "{:<16} {:<13} {:<16} {:>9} {:>7} {:>8} {:>8}",
        "tenant", "event", "label", "count", "failed", "p50 ms", "p95 ms"
    );
    for s in &summary {
        println!(
            "{:<16} {:<13} {:<16} {:>9} {:>7} {:>8} {:>8}",
            name_of(&s.tenant),
            s.event,
            s.label,
            s.count,
            s.failed,
            ms(s.p50_ms),
            ms(s.p95_ms)
        );
    }
    for (what, by) in [("Tab suggestions", &tab), ("next edits", &next_edit)] {
        for (t, (shown, accepted)) in by {
            println!(
                "{t}: {what} accepted {accepted} of {shown} shown ({:.1}%)",
                *accepted as f64 * 100.0 / *shown as f64
            );
        }
    }
    Ok(())
}
