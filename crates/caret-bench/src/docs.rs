//! `caret bench docs`: @Docs over a real documentation site served from loopback (with
//! `ETag`s and `304`s, like a static host): a 500-page crawl to lexical search, the embedding
//! of the whole site, a refresh of the unchanged site, `caret docs search` latency through the
//! warm daemon, and answer quality on a question set (page-level R@1, R@5 and MRR@10).
//!
//! Sources are made under this machine's `$CARET_HOME/docs` with names of their own and
//! removed at the end.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::Response;
use caret_docs::pages::{Origin, Source};
use serde::Deserialize;

use caret_host::config::Config;
use caret_host::runtime::runtime;

use crate::search::percentile;

/// The default question set: SQLite's documentation (others, such as
/// `eval/docs/celery-5.2.6.jsonl`, with `--questions`).
const QUESTIONS: &str = include_str!("data/docs/sqlite-questions.jsonl");

#[derive(Debug, Deserialize)]
struct Question {
    q: String,
    /// Pages that answer it (paths under the site's root).
    pages: Vec<String>,
}

/// What `caret bench docs` measures.
#[derive(Debug, Clone)]
pub struct DocsBench {
    /// The site's directory (default: SQLite's documentation as Debian installs it).
    pub site: PathBuf,
    /// Pages of the timed crawl.
    pub pages: usize,
    /// Requests a second of the crawls.
    pub rate: f64,
    /// Searches for the latency figures.
    pub searches: usize,
    /// A question set (JSON lines of `{"q", "pages"}`) instead of SQLite's.
    pub questions: Option<PathBuf>,
}

/// Runs the benchmark and prints its figures.
pub fn run(config: &Config, bench: DocsBench) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        bench.site.join("index.html").is_file(),
        "{} holds no index.html (Debian: apt install sqlite3-doc, then --site /usr/share/doc/sqlite3)",
        bench.site.display()
    );
    let pid = std::process::id();
    let (timed, full) = (format!("bench-{}-{pid}", bench.pages), format!("bench-site-{pid}"));
    let outcome = runtime()?.block_on(measure(config, &bench, &timed, &full));
    for name in [&timed, &full] {
        if caret_host::docs::dir(config, name).is_ok_and(|d| d.root.exists()) {
            let _ = runtime()?.block_on(caret_host::docs::remove(config, name));
        }
    }
    outcome.map(|()| ExitCode::SUCCESS)
}

async fn measure(config: &Config, bench: &DocsBench, timed: &str, full: &str) -> anyhow::Result<()> {
    let site = serve(bench.site.clone()).await?;
    let start = format!("{site}index.html");
    println!("site: {} served on {site}", bench.site.display());
    let add = |name: &str, max_pages: usize| Source {
        name: name.to_owned(),
        origin: Origin::Site { url: start.clone(), prefix: site.clone(), depth: 10, max_pages, rate: bench.rate },
        refresh: None,
    };
    let mut go_on = |_: &caret_docs::pages::Counts| ControlFlow::Continue(());

    // A crawl of N pages, until lexical search has them (the index kept beside it).
    caret_host::docs::add(config, &add(timed, bench.pages))?;
    let t = Instant::now();
    let u = caret_host::docs::update(config, timed, &mut go_on, false).await?;
    println!(
        "crawl: {} pages in {:.2} s ({:.0} pages/s, {} requests/s allowed); lexically searchable after {:.2} s \
         (the last sync {:.2} s)",
        u.counts.fetched,
        u.crawl_seconds,
        u.counts.fetched as f64 / u.crawl_seconds.max(1e-3),
        bench.rate,
        t.elapsed().as_secs_f64(),
        u.sync_seconds,
    );
    // Embedded, then refreshed unchanged: one request a page, nothing written or embedded.
    let u = caret_host::docs::update(config, timed, &mut go_on, true).await?;
    println!(
        "embedded the {} pages' {} chunks: {} after the start of that update",
        u.counts.fetched,
        u.embedded,
        u.embedded_after.map_or("-".to_owned(), |s| format!("{s:.1} s"))
    );
    let t = Instant::now();
    let r = caret_host::docs::update(config, timed, &mut go_on, true).await?;
    println!(
        "refresh of the unchanged site: {:.2} s ({} requests, {} written, {} unchanged; index +{} ~{} -{}; {} chunks embedded)",
        t.elapsed().as_secs_f64(),
        r.counts.fetched,
        r.counts.written,
        r.counts.unchanged,
        r.synced.0,
        r.synced.1,
        r.synced.2,
        r.embedded,
    );

    // The whole site, crawled and embedded together: until every chunk has its vector.
    caret_host::docs::add(config, &add(full, 100_000))?;
    let u = caret_host::docs::update(config, full, &mut go_on, true).await?;
    let after = u.embedded_after.unwrap_or(0.0);
    println!(
        "whole site: {} pages crawled in {:.1} s; {} chunks embedded beside and after it, all with vectors {:.1} s \
         after the start ({:.0} chunks/s overall, {})",
        u.counts.fetched,
        u.crawl_seconds,
        u.embedded,
        after,
        u.embedded as f64 / after.max(1e-3),
        u.model.as_deref().unwrap_or("no model: lexical only"),
    );
    let text = match &bench.questions {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        None => QUESTIONS.to_owned(),
    };
    let questions: Vec<Question> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("the question set")?;
    anyhow::ensure!(!questions.is_empty(), "the question set is empty");
    let names = [full.to_owned()];
    let (mut r1, mut r5, mut mrr) = (0usize, 0usize, 0.0);
    let mut misses = Vec::new();
    let mut times = Vec::new();
    for q in &questions {
        let t = Instant::now();
        let hits = caret_host::docs::search(config, &q.q, &names, 10).await?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        let mut seen = HashSet::new();
        let pages: Vec<String> = hits
            .iter()
            .map(|h| h.url.split('#').next().unwrap_or("").trim_start_matches(site.as_str()).to_owned())
            .filter(|p| seen.insert(p.clone()))
            .collect();
        match pages.iter().take(10).position(|p| q.pages.contains(p)) {
            Some(i) => {
                r1 += usize::from(i == 0);
                r5 += usize::from(i < 5);
                mrr += 1.0 / (i as f64 + 1.0);
                if i >= 5 {
                    misses.push(format!("{} (rank {})", q.q, i + 1));
                }
            }
            None => {
                misses.push(format!("{} (got {})", q.q, pages.iter().take(3).cloned().collect::<Vec<_>>().join(", ")))
            }
        }
    }
    let n = questions.len() as f64;
    println!(
        "quality ({} questions, page level): R@1 {:.2}  R@5 {:.2}  MRR@10 {:.3}",
        questions.len(),
        r1 as f64 / n,
        r5 as f64 / n,
        mrr / n
    );
    for m in misses {
        println!("  not in the first 5: {m}");
    }
    fusion_bound(config, &questions, &names, &site).await?;
    for _ in 0..bench.searches.saturating_sub(questions.len()).div_ceil(questions.len().max(1)) {
        for q in &questions {
            let t = Instant::now();
            caret_host::docs::search(config, &q.q, &names, 5).await?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    times.sort_by(f64::total_cmp);
    println!(
        "docs search ({} searches{}): p50 {:.1} ms  p99 {:.1} ms",
        times.len(),
        if caret_host::daemon::connect(config).await.is_some() { ", warm daemon" } else { ", in-process" },
        percentile(&times, 0.5),
        percentile(&times, 0.99)
    );
    Ok(())
}

/// The best page-level R@5 that any monotone fusion of the two rankings could reach: a page
/// can be fused above another only if it beats it in at least one of them, so an answer
/// beaten in both by five pages (each list taken as pages, 50 hits deep) stays out of the
/// first five whatever the weights. Shows whether a setting could meet a target at all.
async fn fusion_bound(config: &Config, questions: &[Question], names: &[String], site: &str) -> anyhow::Result<()> {
    use caret_protocol::SearchMode;
    let (mut reachable, mut best_mrr) = (0, 0.0);
    for q in questions {
        let mut ranks = Vec::new();
        for mode in [SearchMode::Lexical, SearchMode::Semantic] {
            let hits = caret_host::docs::search_with(config, &q.q, names, 50, mode).await?;
            let mut pages: Vec<String> = Vec::new();
            for h in hits {
                let p = h.url.split('#').next().unwrap_or("").trim_start_matches(site).to_owned();
                if !pages.contains(&p) {
                    pages.push(p);
                }
            }
            ranks.push(pages);
        }
        let rank = |list: &[String], p: &str| list.iter().position(|x| x == p).unwrap_or(usize::MAX);
        let beaten_by = |target: &str| {
            let (a, b) = (rank(&ranks[0], target), rank(&ranks[1], target));
            if a == usize::MAX && b == usize::MAX {
                return usize::MAX;
            }
            let all: HashSet<&String> = ranks[0].iter().chain(&ranks[1]).collect();
            all.iter().filter(|p| p.as_str() != target && rank(&ranks[0], p) < a && rank(&ranks[1], p) < b).count()
        };
        let best = q.pages.iter().map(|p| beaten_by(p)).min().unwrap_or(usize::MAX);
        reachable += usize::from(best < 5);
        if best < 10 {
            best_mrr += 1.0 / (best as f64 + 1.0);
        }
    }
    println!(
        "  the most any fusion of the lexical and vector rankings could reach: R@5 {:.2} ({reachable}/{}), MRR@10 {:.3}",
        reachable as f64 / questions.len().max(1) as f64,
        questions.len(),
        best_mrr / questions.len().max(1) as f64
    );
    Ok(())
}

/// Serves `root` on loopback as a static host does: `ETag`s from the content, `304` for a
/// matching `If-None-Match`. Its URL (`http://127.0.0.1:PORT/`).
async fn serve(root: PathBuf) -> anyhow::Result<String> {
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let root = root.clone();
        async move { file(&root, uri.path(), &headers) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}/"))
}

fn file(root: &Path, path: &str, headers: &HeaderMap) -> Response {
    let rel = path.trim_start_matches('/');
    let missing = || Response::builder().status(StatusCode::NOT_FOUND).body(Body::empty()).unwrap_or_default();
    if rel.split('/').any(|s| s == "..") {
        return missing();
    }
    let Ok(bytes) = std::fs::read(root.join(if rel.is_empty() { "index.html" } else { rel })) else {
        return missing();
    };
    let etag = format!("\"{}\"", blake3::hash(&bytes).to_hex());
    if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        return Response::builder()
            .status(StatusCode::NOT_MODIFIED)
            .header(header::ETAG, etag)
            .body(Body::empty())
            .unwrap_or_default();
    }
    let kind = match Path::new(rel).extension().and_then(|e| e.to_str()) {
        Some("html") | None => "text/html; charset=utf-8",
        Some("css") => "text/css",
        Some("txt") => "text/plain",
        _ => "application/octet-stream",
    };
    Response::builder()
        .header(header::CONTENT_TYPE, kind)
        .header(header::ETAG, etag)
        .body(Body::from(bytes))
        .unwrap_or_default()
}
