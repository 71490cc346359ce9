//! `caret sync`, `caret status` and `caret key`. A sync asks the local daemon's watcher first
//! (see `caret_host::watch`): nothing changed since a sync that ended in step, one request to
//! the server confirms it still holds that root, and nothing is scanned.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use caret_client::state::WorkspaceState;
use caret_client::sync::SyncReport;
use caret_crypto::WorkspaceKey;
use serde_json::json;

use caret_host::config::{Config, parse_duration};
use caret_host::remote::{Remote, engine, open_workspace, transport};
use caret_host::runtime::runtime;
use caret_host::unchanged;
use caret_host::units::{human_bytes, thousands};

/// Which server to sync with.
#[derive(Debug, clap::Args)]
pub struct RemoteArgs {
    /// A `caret serve` URL (env CARET_SERVER); without one, the embedded server in
    /// $CARET_HOME/local is used in-process.
    #[arg(long, global = true)]
    pub server: Option<String>,
    /// API token for --server (env CARET_TOKEN).
    #[arg(long, global = true)]
    pub token: Option<String>,
}

impl RemoteArgs {
    /// The server these arguments name (none: the embedded one, unless the config names one).
    pub fn remote(&self) -> Remote {
        Remote { server: self.server.clone(), token: self.token.clone() }
    }
}

/// The workspace, the server and the output format: what `sync` and `status` share.
#[derive(Debug, clap::Args)]
pub struct Target {
    /// The workspace.
    #[arg(default_value = ".")]
    pub path: PathBuf,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct SyncArgs {
    #[command(flatten)]
    target: Target,
    /// Keep syncing: every --interval, or sooner when files change.
    #[arg(long)]
    watch: bool,
    /// Interval for --watch (e.g. 90s, 3m, 1h).
    #[arg(long)]
    interval: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    target: Target,
}

fn print_report(r: &SyncReport, ws: &WorkspaceState, to: &str, json: bool) {
    if json {
        let mut v = serde_json::to_value(r).unwrap_or_default();
        v["workspace"] = json!(ws.id);
        v["server"] = json!(to);
        v["in_step"] = json!(r.local_root == r.server_root);
        println!("{v}");
        return;
    }
    println!("caret sync {} → {to} (workspace {})", ws.root.display(), ws.id);
    println!(
        "  files      +{} ~{} -{}, {} unchanged{}",
        r.added,
        r.modified,
        r.deleted,
        thousands(r.unchanged),
        if r.files_skipped > 0 { format!(", {} unreadable now (next sync)", r.files_skipped) } else { String::new() }
    );
    println!(
        "  chunks     {} sent, {} reused, {} withheld (secrets)",
        thousands(r.chunks_sent),
        thousands(r.chunks_reused),
        r.chunks_withheld
    );
    println!(
        "  wire       {} sent, {} received, {} requests",
        human_bytes(r.bytes_sent),
        human_bytes(r.bytes_received),
        r.requests
    );
    let state = if r.local_root == r.server_root { "in step" } else { "server differs: sync again" };
    println!("  root       {} ({state})", r.local_root);
    if r.watcher {
        println!("  time       {:.3} s (the daemon's watcher saw no change since the last sync)", r.seconds);
    } else {
        println!("  time       {:.3} s", r.seconds);
    }
}

pub fn sync(config: &Config, args: SyncArgs) -> anyhow::Result<ExitCode> {
    let ws = open_workspace(config, &args.target.path)?;
    let record = ws.state_dir.join("sync-summary.json");
    let remote = args.target.remote.remote();
    // The watcher's answer and the record's stamp, when a daemon watches.
    let watched = if args.watch {
        None
    } else {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (watched, answered) = rt.block_on(unchanged::sync_without_scanning(config, &ws, &remote, &record));
        if let Some((report, to)) = answered {
            print_report(&report, &ws, &to, args.target.json);
            return Ok(ExitCode::SUCCESS);
        }
        watched
    };
    let engine = engine(config)?;
    runtime()?.block_on(async {
        let transport = transport(config, &remote).await?;
        let to = transport.describe();
        if args.watch {
            let interval = parse_duration(args.interval.as_deref().unwrap_or(&config.sync.interval))?;
            let json = args.target.json;
            caret_client::watch::watch(
                &engine,
                &ws,
                transport.as_ref(),
                interval,
                |result| match result {
                    Ok(r) => print_report(&r, &ws, &to, json),
                    Err(e) => eprintln!("caret: sync failed (retrying): {e}"),
                },
                caret_host::runtime::shutdown_signal(),
            )
            .await?;
        } else {
            caret_host::watch::forget(&record);
            let report = engine
                .sync(&ws, transport.as_ref())
                .await
                .with_context(|| format!("syncing {} with {to}", ws.root.display()))?;
            // In step, under a watcher asked before the scan began: the next sync may answer
            // from this.
            if let Some((at, stamp)) = &watched
                && report.local_root == report.server_root
                && report.files_skipped == 0
            {
                let kept = unchanged::InStep {
                    root: report.local_root.clone(),
                    files: report.unchanged + report.added + report.modified,
                };
                if let Err(e) = caret_host::watch::save(&record, at, stamp, &kept) {
                    tracing::debug!("keeping the sync's result: {e}");
                }
            }
            print_report(&report, &ws, &to, args.target.json);
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

pub fn status(config: &Config, StatusArgs { target: args }: StatusArgs) -> anyhow::Result<ExitCode> {
    let ws = open_workspace(config, &args.path)?;
    let engine = engine(config)?;
    runtime()?.block_on(async {
        let transport = transport(config, &args.remote.remote()).await?;
        let to = transport.describe();
        let local = engine.local_tree(&ws).await?;
        let known = transport.workspace(&ws.id).await;
        let pending = match &known {
            Ok(_) => Some(engine.compare(&ws, &local, transport.as_ref()).await?),
            Err(caret_client::Error::Server { status: 404, .. }) => None,
            Err(e) => anyhow::bail!("asking {to} about workspace {}: {e}", ws.id),
        };
        // Each embedding stage's progress (code, tests, the rest), when the server embeds.
        let stages = match &known {
            Ok(info) if info.model.is_some() => {
                transport.missing_vectors(&ws.id, 0).await.map(|m| m.stages).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        let local_root = local.tree.root_hash().to_hex();
        let (server_root, added, modified, deleted) = match &pending {
            Some(p) => (p.server_root.clone(), p.added.len(), p.modified.len(), p.deletes.len()),
            None => (String::new(), local.tree.len(), 0, 0),
        };
        if args.json {
            println!(
                "{}",
                json!({
                    "workspace": ws.id, "server": to, "local_root": local_root,
                    "server_root": if server_root.is_empty() { serde_json::Value::Null } else { json!(server_root) },
                    "files": local.tree.len(), "in_step": local_root == server_root,
                    "pending": {"added": added, "modified": modified, "deleted": deleted},
                    "vectors": known.as_ref().ok().map(|i| json!({
                        "model": i.model, "embedded": i.embedded, "embeddable": i.embeddable,
                        "stages": stages,
                    })),
                })
            );
        } else {
            println!("caret status {} ({to}, workspace {})", ws.root.display(), ws.id);
            println!("  local      {local_root} ({} files)", thousands(local.tree.len() as u64));
            if server_root.is_empty() {
                println!("  server     never synced");
            } else {
                println!("  server     {server_root}");
            }
            if local_root == server_root {
                println!("  pending    nothing: in step");
            } else {
                println!("  pending    +{added} ~{modified} -{deleted} (run caret sync)");
            }
            if let Ok(info) = &known {
                match &info.model {
                    Some(model) => {
                        let pct = if info.embeddable == 0 {
                            100.0
                        } else {
                            100.0 * info.embedded as f64 / info.embeddable as f64
                        };
                        let hint = if info.embedded < info.embeddable { " (run caret index)" } else { "" };
                        println!(
                            "  vectors    {} of {} chunks ({pct:.0}%), {model}{hint}",
                            thousands(info.embedded),
                            thousands(info.embeddable)
                        );
                        // Embedded in this order: say how far each stage is.
                        let parts: Vec<String> = stages
                            .iter()
                            .filter(|s| s.total > 0)
                            .map(|s| {
                                let with = s.total - s.missing.min(s.total);
                                if with == s.total {
                                    format!("{} done", s.name)
                                } else {
                                    format!("{} {}%", s.name, 100 * with / s.total)
                                }
                            })
                            .collect();
                        if !parts.is_empty() {
                            println!("  stages     {}", parts.join(", "));
                        }
                    }
                    None => println!("  vectors    none: no embedding model (search is lexical only)"),
                }
            }
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, clap::Subcommand)]
pub enum KeyCommand {
    /// Print the workspace's key, to share with a team out of band.
    Export {
        /// The workspace.
        #[arg(default_value = ".")]
        path: PathBuf,
    },
    /// Use a shared key for this workspace (read from the argument or standard input).
    Import {
        /// The workspace.
        #[arg(default_value = ".")]
        path: PathBuf,
        /// The key (caret-key-v1-…); read from standard input when absent.
        #[arg(long)]
        key: Option<String>,
        /// Replace an existing, different key (the old one is kept as .key.old).
        #[arg(long)]
        force: bool,
    },
}

pub fn key(config: &Config, cmd: KeyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        KeyCommand::Export { path } => {
            let ws = open_workspace(config, &path)?;
            println!("{}", ws.key.export());
            eprintln!(
                "(anyone with this key can read the workspace's index names and match its content; share it privately)"
            );
        }
        KeyCommand::Import { path, key, force } => {
            let text = match key {
                Some(k) => k,
                None => {
                    let mut s = String::new();
                    std::io::stdin().read_to_string(&mut s).context("reading the key from standard input")?;
                    s
                }
            };
            let key = WorkspaceKey::import(&text)?;
            let mut ws = open_workspace(config, &path)?;
            if ws.key == key {
                println!("the workspace already uses this key ({})", key.key_id());
            } else if !force {
                anyhow::bail!(
                    "the workspace {} already has a different key ({}); pass --force to replace it",
                    ws.root.display(),
                    ws.key.key_id()
                );
            } else {
                ws.replace_key(key)?;
                println!("imported key {} for {}", ws.key.key_id(), ws.root.display());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
