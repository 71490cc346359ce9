//! `caret bench sync`: what sync costs on the wire and in time, in one run.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use caret_client::state::WorkspaceState;
use caret_client::sync::{SyncEngine, SyncOptions, SyncReport};
use caret_client::transport::HttpTransport;
use caret_index::StorageConfig;
use caret_server::ServeConfig;
use caret_server::limit::RateLimit;
use caret_workspace::scan::{Depth, Scanner};

use caret_host::config::Config;
use caret_host::runtime::runtime;
use caret_host::units::{human_bytes, thousands};

/// Runs this benchmark and prints its figures.
pub fn run(config: &Config, path: &Path, changes: usize) -> anyhow::Result<ExitCode> {
    let scratch = config.home.join("bench").join(format!("sync-{}", std::process::id()));
    let result = bench(config, path, changes, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn bench(config: &Config, path: &Path, changes: usize, scratch: &Path) -> anyhow::Result<ExitCode> {
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
    println!("caret bench sync {} ({} candidate files copied)", source.display(), thousands(walked.files.len() as u64));

    let scanner = Arc::new(Scanner::new(config.walk_config(), config.chunker()?, Depth::Hash));
    let engine = SyncEngine::new(scanner, SyncOptions::default());
    let ws = WorkspaceState::open(&tree, &scratch.join("state"), &scratch.join("keys"))?;
    let rt = runtime()?;
    rt.block_on(async {
        let service = Arc::new(caret_index::open(&StorageConfig::local(&scratch.join("server"))).await?);
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
        rows.push(("first sync".into(), engine.sync(&ws, &transport).await?));
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
        let one = &rows[2].1;
        println!(
            "one-file change: {} on the wire for a {}-file tree ({:.4} bytes per file in the tree)",
            human_bytes(one.bytes_sent + one.bytes_received),
            thousands(rows[0].1.added),
            (one.bytes_sent + one.bytes_received) as f64 / rows[0].1.added.max(1) as f64
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
