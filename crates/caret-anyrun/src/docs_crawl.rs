//! A worker's docs crawl: a team docs source's site crawled through an allow-list proxy of
//! the worker's own (the site's host and port only, every address checked against the
//! worker's egress policy, as for runs), conditionally against the page state the lease brings, with the
//! new or changed pages sent back with the completion. Nothing is indexed here: the server
//! indexes what comes back.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use caret_docs::pages::{Counts, SourceDir, State};
use caret_protocol::docs::DocsCounts;
use caret_protocol::runs::{DocsCrawl, DocsCrawled, Lease, RunEvent, RunStatus};

use crate::coordinator::Coordinator;

/// The most a crawl's pages may come to, compressed (a completion is one request).
pub const MAX_PAGES_BYTES: usize = 40 << 20;
/// How often the crawl's counts are reported.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// A crawl's counts as the wire carries them.
pub fn wire_counts(c: &Counts) -> DocsCounts {
    DocsCounts {
        found: c.found,
        fetched: c.fetched,
        written: c.written,
        unchanged: c.unchanged,
        removed: c.removed,
        skipped: c.skipped.clone(),
        failed: c.failed.clone(),
    }
}

/// Packs pages (file → Markdown) as [`DocsCrawled::pages`] carries them.
pub fn pack_pages(pages: &BTreeMap<String, String>) -> std::io::Result<String> {
    let json = serde_json::to_vec(pages)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&json)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(gz.finish()?))
}

/// Unpacks [`DocsCrawled::pages`] (at most `limit` bytes unpacked).
pub fn unpack_pages(packed: &str, limit: u64) -> Result<BTreeMap<String, String>, String> {
    use std::io::Read as _;
    let bytes =
        base64::engine::general_purpose::STANDARD.decode(packed.trim()).map_err(|e| format!("not base64: {e}"))?;
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .take(limit + 1)
        .read_to_end(&mut json)
        .map_err(|e| format!("not gzip: {e}"))?;
    if json.len() as u64 > limit {
        return Err(format!("the pages come to more than {limit} bytes"));
    }
    serde_json::from_slice(&json).map_err(|e| format!("not a JSON object of pages: {e}"))
}

/// Crawls `job` in `run_dir` while `go` says so; what to complete with, or why not (and
/// whether another attempt may do better).
pub(crate) async fn crawl(
    coord: &Arc<dyn Coordinator>,
    lease: &Lease,
    job: &DocsCrawl,
    run_dir: &Path,
    egress: &caret_sandbox::egress::Egress,
    go: impl Fn() -> bool + Send + Sync,
) -> Result<DocsCrawled, (String, bool)> {
    let fatal = |what: &str, e: &dyn std::fmt::Display| (format!("{what}: {e}"), false);
    let local = |what: &str, e: &dyn std::fmt::Display| (format!("{what}: {e}"), true);
    let bytes = coord.bundle(&lease.lease).await.map_err(|e| local("fetching the page state", &e))?;
    let before: State = if bytes.is_empty() {
        State::default()
    } else {
        serde_json::from_slice(&bytes).map_err(|e| fatal("the page state", &e))?
    };
    let d = SourceDir::new(run_dir.join("docs"));
    std::fs::create_dir_all(d.pages()).map_err(|e| local("the crawl's directory", &e))?;
    d.save_state(&before).map_err(|e| local("the crawl's directory", &e))?;

    // The runs' network rules: the site's host and port only, through a proxy of our own.
    let url = url::Url::parse(&job.url).map_err(|e| fatal(&job.url, &e))?;
    let host = url.host_str().unwrap_or_default();
    let allow = format!("{host}:{}", url.port_or_known_default().unwrap_or(443));
    let allow = caret_sandbox::netproxy::AllowList::parse(&[allow]).map_err(|e| fatal("the site", &e))?;
    egress.check_literal(host, url.port_or_known_default().unwrap_or(443)).map_err(|e| fatal("the site", &e))?;
    let gate = caret_sandbox::netproxy::Gate::open(allow.under(egress.clone())).map_err(|e| local("the proxy", &e))?;

    let mut settings = caret_docs::crawl::Settings::new(url);
    settings.prefix = job.prefix.clone();
    settings.depth = job.depth;
    settings.max_pages = usize::try_from(job.max_pages).unwrap_or(usize::MAX);
    settings.rate = job.rate;
    settings.proxy = Some(gate.url());

    // Progress: the counts, sent as events every few seconds while they move.
    let so_far = Arc::new(Mutex::new(Counts::default()));
    let reporter = {
        let (coord, lease_ref, so_far) = (coord.clone(), lease.lease.clone(), so_far.clone());
        tokio::spawn(async move {
            let mut sent = Counts::default();
            loop {
                tokio::time::sleep(PROGRESS_EVERY).await;
                let now = so_far.lock().unwrap_or_else(PoisonError::into_inner).clone();
                if now != sent {
                    let event = RunEvent::Run(RunStatus::DocsProgress { counts: wire_counts(&now) });
                    if let Err(e) = coord.events(&lease_ref, vec![event]).await {
                        tracing::debug!(run = %lease_ref.run, "reporting the crawl's progress: {e}");
                    }
                    sent = now;
                }
            }
        })
    };
    let mut progress = |c: &Counts| {
        *so_far.lock().unwrap_or_else(PoisonError::into_inner) = c.clone();
        if go() { ControlFlow::Continue(()) } else { ControlFlow::Break(()) }
    };
    let crawled = caret_docs::crawl::crawl(&d, &settings, &mut progress).await;
    reporter.abort();
    drop(gate);
    let counts = crawled.map_err(|e| (format!("{e}"), false))?;
    tracing::info!(run = %lease.lease.run, source = %job.source, written = counts.written, unchanged = counts.unchanged, "docs crawled");

    // What comes back: the state, and the pages whose content is new.
    let after = d.state().map_err(|e| local("the crawl's state", &e))?;
    let old: HashMap<&str, &str> = before.pages.values().map(|p| (p.file.as_str(), p.hash.as_str())).collect();
    let mut pages = BTreeMap::new();
    for page in after.pages.values() {
        if old.get(page.file.as_str()) != Some(&page.hash.as_str()) {
            let text = std::fs::read_to_string(d.pages().join(&page.file)).map_err(|e| local(&page.file, &e))?;
            pages.insert(page.file.clone(), text);
        }
    }
    let packed = pack_pages(&pages).map_err(|e| local("packing the pages", &e))?;
    if packed.len() > MAX_PAGES_BYTES {
        return Err((
            format!(
                "the crawl's {} new pages come to {} MiB compressed, more than the {} MiB one update takes: \
                 lower max_pages or split the source by prefix",
                pages.len(),
                packed.len() >> 20,
                MAX_PAGES_BYTES >> 20
            ),
            false,
        ));
    }
    let state = serde_json::to_string(&after).map_err(|e| local("the crawl's state", &e))?;
    Ok(DocsCrawled { state, counts: wire_counts(&counts), pages: packed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_trip_and_a_bomb_is_refused() {
        let pages: BTreeMap<String, String> =
            [("a.md".to_owned(), "# A\n\ntext".to_owned()), ("b/c.md".to_owned(), "x".repeat(100_000))].into();
        let packed = pack_pages(&pages).unwrap();
        assert!(packed.len() < 10_000, "compressed: {}", packed.len());
        assert_eq!(unpack_pages(&packed, 1 << 20).unwrap(), pages);
        let err = unpack_pages(&packed, 50_000).unwrap_err();
        assert!(err.contains("more than 50000 bytes"), "{err}");
        assert!(unpack_pages("not base64!", 1 << 20).unwrap_err().contains("base64"));
    }
}
