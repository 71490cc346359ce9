//! `caret bench sync`: what sync costs on the wire and in time, in one run.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use caret_client::state::WorkspaceState;
use caret_client::sync::{SyncEngine, SyncOptions, SyncReport};
use caret_client::transport::{HttpTransport, Transport as _};
use caret_index::StorageConfig;
use caret_server::ServeConfig;
use caret_server::limit::RateLimit;
use caret_workspace::scan::{Depth, Scanner};

use caret_host::config::Config;
use caret_host::runtime::runtime;
use caret_host::units::{human_bytes, thousands};

/// Runs this benchmark and prints its figures.
pub fn run(config: &Config, path: &Path, changes: usize, embed: bool) -> anyhow::Result<ExitCode> {
    let scratch = config.home.join("bench").join(format!("sync-{}", std::process::id()));
    let result = bench(config, path, changes, embed, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn bench(config: &Config, path: &Path, changes: usize, embed: bool, scratch: &Path) -> anyhow::Result<ExitCode> {
    let source = std::fs::canonicalize(path).with_context(|| format!("opening {}", path.display()))?;
    let tree = scratch.join("tree");
    let walked = caret_workspace::walk::walk(&source, &config.walk_config())?;
    for f in &walked.files {
        let to = f.path.under(&tree);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::copy(f.path.under(&source), &to).with_context(|| format!("copying {}", f.path))?;
        // Files written seconds ago are re-read on every scan by design (the racy-clean
        // guard); a real tree's files are older.
        set_mtime(&to, 120)?;
    }
    let source_bytes: u64 = walked.files.iter().map(|f| f.stat.size).sum();
    println!(
        "caret bench sync {} ({} candidate files copied, {})",
        source.display(),
        thousands(walked.files.len() as u64),
        human_bytes(source_bytes)
    );
    let model = if embed {
        Some(
            config
                .embedding_model()?
                .context("no embedding model installed: run `caret models pull` (or --no-embed)")?,
        )
    } else {
        None
    };

    let scanner = Arc::new(Scanner::new(config.walk_config(), config.chunker()?, Depth::Hash));
    let engine = SyncEngine::new(scanner.clone(), SyncOptions::default());
    let ws = WorkspaceState::open(&tree, &scratch.join("state"), &scratch.join("keys"))?;
    let rt = runtime()?;
    rt.block_on(async {
        let mut service = caret_index::open(&StorageConfig::local(&scratch.join("server"))).await?;
        if let Some(model) = model {
            println!("embedding with {}", model.id());
            service = service.with_embedding(model);
        }
        let service = Arc::new(service);
        let tenant = service.db().create_tenant("bench").await?;
        let token = service.db().create_token(&tenant, "bench").await?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}", listener.local_addr()?);
        let serve = ServeConfig {
            addr: listener.local_addr()?,
            tls: None,
            allow_insecure_http: false,
            rate_limit: RateLimit { per_second: 1e6, burst: 1_000_000 },
            ip_rate_limit: RateLimit { per_second: 1e6, burst: 1_000_000 },
            body_limit: 256 << 20,
            gateway: None,
            agent: Default::default(),
            runs: None,
            docs: None,
            pages: None,
            replicas: caret_server::Replicas::Join(None),
            usage: caret_usage::Recorder::off(),
            identity: None,
            sign_in: None,
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(caret_server::serve(service, serve, listener, async move {
            let _ = stop_rx.await;
        }));
        let transport = HttpTransport::new(&url, &token, None)?;

        let mut rows: Vec<(String, SyncReport)> = Vec::new();
        // Embedding after a sync, counted as a step of its own (bytes from the wire counter).
        let embed_step = |label: &str| {
            let (engine_ws, transport, scanner) = (&ws, &transport, scanner.clone());
            let label = label.to_owned();
            async move {
                let before = transport.wire().get();
                let report = caret_client::index::embed_missing(scanner, engine_ws, transport, |_| {}).await?;
                let after = transport.wire().get();
                anyhow::Ok((
                    label,
                    SyncReport {
                        seconds: report.seconds,
                        bytes_sent: after.0 - before.0,
                        bytes_received: after.1 - before.1,
                        requests: after.2 - before.2,
                        chunks_sent: report.progress.embedded,
                        ..SyncReport::default()
                    },
                ))
            }
        };
        rows.push(("first sync".into(), engine.sync(&ws, &transport).await?));
        if embed {
            rows.push(embed_step("  its embedding").await?);
        }
        rows.push(("no-change sync".into(), engine.sync(&ws, &transport).await?));
        let files: Vec<_> = walked.files.iter().filter(|f| f.stat.size > 0).collect();
        let touch = |n: usize, round: usize| -> anyhow::Result<()> {
            let step = (files.len() / n.max(1)).max(1);
            // Start mid-tree, so one change is a typical (nested) file rather than the first.
            for f in files.iter().skip(step / 2).step_by(step).take(n) {
                let p = f.path.under(&tree);
                let mut text = std::fs::read(&p)?;
                text.extend_from_slice(format!("\n// caret bench edit {round}\n").as_bytes());
                std::fs::write(&p, text)?;
                set_mtime(&p, 60 - 10 * round as u64)?;
            }
            Ok(())
        };
        touch(1, 1)?;
        rows.push(("one changed file".into(), engine.sync(&ws, &transport).await?));
        if embed {
            rows.push(embed_step("  its embedding").await?);
        }
        touch(changes, 2)?;
        rows.push((
            format!("{} changed files", thousands(changes.min(files.len()) as u64)),
            engine.sync(&ws, &transport).await?,
        ));
        let _ = stop_tx.send(());
        let _ = server.await;

        println!(
            "{:<22} {:>9} {:>12} {:>12} {:>9} {:>8} {:>10} {:>10}",
            "step", "time", "sent", "received", "requests", "files", "chunks↑", "reused"
        );
        for (name, r) in &rows {
            println!(
                "{:<22} {:>8.2}s {:>12} {:>12} {:>9} {:>8} {:>10} {:>10}",
                name,
                r.seconds,
                human_bytes(r.bytes_sent),
                human_bytes(r.bytes_received),
                r.requests,
                thousands(r.added + r.modified + r.deleted),
                thousands(r.chunks_sent),
                thousands(r.chunks_reused)
            );
        }
        let in_step = rows.iter().all(|(_, r)| r.local_root == r.server_root);
        println!("every step ended in step with the server: {in_step}");
        // A step and the embedding row after it.
        let with_embedding = |name: &str| -> (u64, u64) {
            let at = rows.iter().position(|(n, _)| n == name).unwrap_or(0);
            let mut it = rows[at..].iter();
            let mut total = it.next().map_or((0, 0), |(_, r)| (r.bytes_sent, r.bytes_received));
            if let Some((_, r)) = it.next().filter(|(n, _)| n.starts_with("  ")) {
                total = (total.0 + r.bytes_sent, total.1 + r.bytes_received);
            }
            total
        };
        let first = with_embedding("first sync");
        println!(
            "first sync{}: {} sent by the client, {:.2}x the source's {} ({} received)",
            if embed { " and embedding" } else { " (not embedded)" },
            human_bytes(first.0),
            first.0 as f64 / source_bytes.max(1) as f64,
            human_bytes(source_bytes),
            human_bytes(first.1)
        );
        let one = with_embedding("one changed file");
        println!(
            "one-file change{}: {} on the wire ({} sent, {} received) for a {}-file tree",
            if embed { " and its embedding" } else { "" },
            human_bytes(one.0 + one.1),
            human_bytes(one.0),
            human_bytes(one.1),
            thousands(rows[0].1.added),
        );
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn set_mtime(path: &Path, secs_ago: u64) -> anyhow::Result<()> {
    let when = std::time::SystemTime::now() - std::time::Duration::from_secs(secs_ago);
    std::fs::File::options().write(true).open(path)?.set_modified(when)?;
    Ok(())
}
