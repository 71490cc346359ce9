//! Crawling a docs site into a source's directory.
//!
//! Breadth first from the start URL (and the URLs of the site's sitemaps, or the links of an
//! `llms.txt`), following links on the same origin that start with the prefix, up to a depth
//! and a page count, as `robots.txt` allows, at most `rate` requests a second (fewer when the
//! site asks for a `Crawl-delay`) with a few in flight. Each URL is fetched once per crawl;
//! redirects are followed (a loop or a target outside the prefix is counted, not followed);
//! a page naming a canonical URL is kept under it once. HTML and Markdown only; anything
//! else, a body over the size cap or one that looks binary is skipped; 4xx/5xx and timeouts
//! are counted. None of it stops the crawl: only a start URL that cannot be fetched does.
//!
//! A refresh sends each known page's `ETag`/`Last-Modified` (those requests go at ten times
//! the rate: a `304` costs the site a header): a `304` costs one request and keeps the page
//! (and its links) as it was; a page whose Markdown did not change is not
//! written again, so the index has nothing to do for it. Pages the crawl no longer reaches
//! are removed. The state is saved every few pages: a crawl that was interrupted resumes
//! without fetching again what it had (their links come from the state).
//!
//! Parsing runs on blocking threads beside the fetches. Answers are taken in the order they
//! were asked for, so a crawl of the same site visits the same pages in the same order (and
//! a page limit keeps the same pages).

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use futures::stream::FuturesOrdered;

use crate::extract::{self, Extracted};
use crate::pages::{Counts, PageState, SourceDir, State};
use crate::robots::Robots;
use crate::{Error, Result};

/// How a crawl goes.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where it starts.
    pub start: url::Url,
    /// Only URLs starting with this are pages.
    pub prefix: String,
    /// Links followed from the start, at most.
    pub depth: u32,
    /// Pages kept, at most.
    pub max_pages: usize,
    /// Requests a second, at most.
    pub rate: f64,
    /// Requests in flight, at most.
    pub concurrency: usize,
    /// Largest body read, bytes.
    pub max_bytes: usize,
    /// One request's time limit.
    pub timeout: Duration,
    /// Read the site's sitemaps for more URLs.
    pub sitemaps: bool,
    /// Every request through this HTTP proxy (a server's allow-list proxy); none: direct.
    pub proxy: Option<String>,
}

impl Settings {
    /// A crawl from `start` under its directory, 4 levels deep, 2,000 pages, 20 requests a
    /// second with 4 in flight, 5 MiB a page.
    pub fn new(start: url::Url) -> Settings {
        let prefix = default_prefix(&start);
        Settings {
            start,
            prefix,
            depth: 4,
            max_pages: 2000,
            rate: 20.0,
            concurrency: 4,
            max_bytes: 5 << 20,
            timeout: Duration::from_secs(30),
            sitemaps: true,
            proxy: None,
        }
    }
}

/// A URL's directory: `https://h/docs/` for `https://h/docs/intro.html`.
pub fn default_prefix(url: &url::Url) -> String {
    let s = url.as_str();
    let s = s.split(['?', '#']).next().unwrap_or(s);
    match s.rfind('/') {
        Some(i) if i + 1 > url.origin().ascii_serialization().len() => s[..=i].to_owned(),
        _ => format!("{}/", url.origin().ascii_serialization()),
    }
}

/// The user agent of Caret's requests.
const AGENT: &str = concat!("caret-docs/", env!("CARGO_PKG_VERSION"));

/// How many times the rate revalidations may go at.
const REVALIDATE: f64 = 10.0;

/// State is saved after this many pages.
const SAVE_EVERY: u64 = 25;

/// What a fetch gave.
enum Got {
    Page {
        url: url::Url,
        page: Box<Extracted>,
        etag: Option<String>,
        last_modified: Option<String>,
    },
    NotModified,
    Skip(String),
    /// The page is not there (404, 410): a known one leaves the source.
    Gone(String),
    /// It could not be had now (5xx, a timeout…): a known one is kept as it was.
    Fail(String),
}

/// Crawls `settings.start` into `dir`, telling `progress` the counts as they change (it may
/// stop the crawl: the state is saved and the next crawl resumes it); the counts at the end.
pub async fn crawl(
    dir: &SourceDir,
    settings: &Settings,
    progress: &mut (dyn FnMut(&Counts) -> ControlFlow<()> + Send),
) -> Result<Counts> {
    let mut client = reqwest::Client::builder()
        .user_agent(AGENT)
        .timeout(settings.timeout)
        .redirect(reqwest::redirect::Policy::limited(10));
    if let Some(proxy) = &settings.proxy {
        let proxy = reqwest::Proxy::all(proxy).map_err(|e| Error::BadRequest(format!("the proxy {proxy}: {e}")))?;
        client = client.proxy(proxy);
    }
    let client = client.build().map_err(|e| Error::BadRequest(format!("an HTTP client: {e}")))?;
    let origin = settings.start.origin().ascii_serialization();
    let robots = match client.get(format!("{origin}/robots.txt")).send().await {
        Ok(r) if r.status().is_success() => Robots::parse(&r.text().await.unwrap_or_default(), "caret"),
        _ => Robots::default(),
    };
    let rate = match robots.crawl_delay {
        Some(d) if d > 0.0 => settings.rate.min(1.0 / d),
        _ => settings.rate,
    };
    let interval = Duration::from_secs_f64(1.0 / rate.max(0.01));
    let mut rec = Recorder::open(dir, &settings.prefix)?;
    let mut crawl = Frontier::new(settings, robots);
    crawl.push(settings.start.clone(), 0, &mut rec.counts);
    let llms = settings.start.path().ends_with("llms.txt") || settings.start.path().ends_with("llms-full.txt");
    if settings.sitemaps && !llms {
        let mut maps: Vec<String> = crawl.robots.sitemaps.clone();
        maps.push(format!("{origin}/sitemap.xml"));
        for u in sitemap_urls(&client, &maps, settings.max_bytes).await {
            crawl.push(u, 1, &mut rec.counts);
        }
    }
    let mut inflight = FuturesOrdered::new();
    let mut next_start = tokio::time::Instant::now();
    let mut first = true;
    let mut stopping = false;
    loop {
        while !stopping && inflight.len() < settings.concurrency.max(1) {
            let Some((url, depth)) = crawl.queue.pop_front() else { break };
            // Taken this crawl already (an interrupted one resumed): its links, no request.
            if let Some(p) = rec.state.pages.get(url.as_str()).filter(|p| p.crawl == rec.id) {
                let links = p.links.clone();
                rec.counts.resumed += 1;
                crawl.links(&links, depth, &mut rec.counts);
                continue;
            }
            let known = rec.state.pages.get(url.as_str()).map(|p| (p.etag.clone(), p.last_modified.clone()));
            // A revalidation (a page known with its validators) costs the site a header when
            // nothing changed: those go at REVALIDATE times the rate.
            let revalidating = known.as_ref().is_some_and(|(e, m)| e.is_some() || m.is_some());
            tokio::time::sleep_until(next_start).await;
            next_start =
                tokio::time::Instant::now() + if revalidating { interval.div_f64(REVALIDATE) } else { interval };
            let (client, max, prefix) = (client.clone(), settings.max_bytes, settings.prefix.clone());
            inflight.push_back(async move {
                let got = fetch(&client, &url, known, max, &prefix).await;
                (url, depth, got)
            });
        }
        let Some((url, depth, got)) = inflight.next().await else { break };
        if std::mem::take(&mut first)
            && let Got::Fail(why) | Got::Gone(why) = &got
            && url == settings.start
        {
            return Err(Error::Fetch { url: url.to_string(), why: why.clone() });
        }
        match got {
            Got::Page { url: at, page, etag, last_modified } => {
                rec.counts.fetched += 1;
                // Kept under its canonical URL (when that is a page of the source), once.
                let key = page
                    .canonical
                    .clone()
                    .filter(|c| c.as_str().starts_with(&settings.prefix))
                    .unwrap_or(at)
                    .to_string();
                if key != url.as_str() && !crawl.seen.insert(key.clone()) && rec.done(&key) {
                    *rec.counts.skipped.entry("a duplicate of its canonical page".into()).or_default() += 1;
                } else {
                    let links: Vec<String> = page.links.iter().map(url::Url::to_string).collect();
                    let links = crawl.in_scope(&links);
                    rec.record(&key, depth, &page, links.clone(), etag, last_modified)?;
                    if !llms || depth == 0 {
                        crawl.links(&links, depth, &mut rec.counts);
                    }
                }
            }
            Got::NotModified => {
                rec.counts.fetched += 1;
                rec.counts.unchanged += 1;
                let links = rec.keep(url.as_str());
                crawl.links(&links, depth, &mut rec.counts);
            }
            Got::Skip(why) => *rec.counts.skipped.entry(why).or_default() += 1,
            Got::Gone(why) => *rec.counts.failed.entry(why).or_default() += 1,
            Got::Fail(why) => {
                *rec.counts.failed.entry(why).or_default() += 1;
                // A page known from before stays until the site says it is gone.
                let links = rec.keep(url.as_str());
                crawl.links(&links, depth, &mut rec.counts);
            }
        }
        // Asked to stop: what is in flight is still taken, nothing more is asked for.
        stopping |= progress(&rec.counts).is_break();
        rec.save_now_and_then()?;
    }
    if stopping {
        rec.stop()?;
        return Err(Error::Stopped);
    }
    rec.finish()
}

/// What is to be fetched, and what was seen.
struct Frontier<'a> {
    settings: &'a Settings,
    robots: Robots,
    queue: VecDeque<(url::Url, u32)>,
    seen: HashSet<String>,
}

impl<'a> Frontier<'a> {
    fn new(settings: &'a Settings, robots: Robots) -> Frontier<'a> {
        Frontier { settings, robots, queue: VecDeque::new(), seen: HashSet::new() }
    }

    /// The links that are pages of the source.
    fn in_scope(&self, links: &[String]) -> Vec<String> {
        links.iter().filter(|l| l.starts_with(&self.settings.prefix)).cloned().collect()
    }

    /// Queues `links` of a page at `depth` (within the depth).
    fn links(&mut self, links: &[String], depth: u32, counts: &mut Counts) {
        if depth >= self.settings.depth {
            return;
        }
        for l in links {
            if let Ok(u) = url::Url::parse(l) {
                self.push(u, depth + 1, counts);
            }
        }
    }

    /// Queues `url` if it is in scope, allowed, new and within the page count.
    fn push(&mut self, mut url: url::Url, depth: u32, counts: &mut Counts) {
        url.set_fragment(None);
        if !url.as_str().starts_with(&self.settings.prefix) || self.seen.contains(url.as_str()) {
            return;
        }
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        if let Some(why) = generated_copy(url.path()) {
            self.seen.insert(url.to_string());
            *counts.skipped.entry(why.into()).or_default() += 1;
            return;
        }
        if !self.robots.allows(&path) {
            self.seen.insert(url.to_string());
            *counts.skipped.entry("disallowed by robots.txt".into()).or_default() += 1;
            return;
        }
        if self.seen.len() >= self.settings.max_pages {
            *counts.skipped.entry("over the page limit".into()).or_default() += 1;
            return;
        }
        self.seen.insert(url.to_string());
        counts.found += 1;
        self.queue.push_back((url, depth));
    }
}

/// Why a path is a docs generator's copy of what the site's pages already say, not a page
/// of its own: Sphinx's `_sources/` (each page's reStructuredText, linked as "Show Source")
/// would otherwise be indexed beside its page and split the page's hits in two.
fn generated_copy(path: &str) -> Option<&'static str> {
    path.split('/').any(|s| s == "_sources").then_some("a page's source (Sphinx `_sources/`)")
}

/// Fetches one URL: a page (parsed on a blocking thread), or why not.
async fn fetch(
    client: &reqwest::Client,
    url: &url::Url,
    known: Option<(Option<String>, Option<String>)>,
    max: usize,
    prefix: &str,
) -> Got {
    let mut req = client.get(url.clone());
    if let Some((etag, modified)) = known {
        if let Some(e) = etag {
            req = req.header(reqwest::header::IF_NONE_MATCH, e);
        }
        if let Some(m) = modified {
            req = req.header(reqwest::header::IF_MODIFIED_SINCE, m);
        }
    }
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) if e.is_redirect() => return Got::Fail("too many redirects (a loop?)".into()),
        Err(e) if e.is_timeout() => return Got::Fail("timed out".into()),
        Err(e) => return Got::Fail(format!("request failed: {}", root_cause(&e))),
    };
    let status = resp.status();
    if status == reqwest::StatusCode::NOT_MODIFIED {
        return Got::NotModified;
    }
    if matches!(status.as_u16(), 404 | 410) {
        return Got::Gone(format!("HTTP {}", status.as_u16()));
    }
    if !status.is_success() {
        // A refusal of the allow-list proxy says why in its body (`caret: …`).
        let body =
            if matches!(status.as_u16(), 403 | 502) { resp.text().await.unwrap_or_default() } else { String::new() };
        return Got::Fail(match body.lines().next().filter(|l| l.starts_with("caret: ")) {
            Some(why) => format!("HTTP {} ({})", status.as_u16(), why.chars().take(200).collect::<String>()),
            None => format!("HTTP {}", status.as_u16()),
        });
    }
    let at = resp.url().clone();
    if !at.as_str().starts_with(prefix) {
        return Got::Skip("redirected out of the prefix".into());
    }
    let header =
        |name: reqwest::header::HeaderName| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let kind = header(reqwest::header::CONTENT_TYPE).unwrap_or_default().to_ascii_lowercase();
    let path = at.path().to_ascii_lowercase();
    let markdown = kind.contains("markdown")
        || (kind.starts_with("text/plain") && [".md", ".markdown", ".txt"].iter().any(|e| path.ends_with(e)));
    let html = kind.contains("html") || (kind.is_empty() && (path.ends_with(".html") || path.ends_with(".htm")));
    if !markdown && !html {
        return Got::Skip("not HTML or Markdown".into());
    }
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Got::Skip("over the size limit".into());
    }
    let (etag, last_modified) = (header(reqwest::header::ETAG), header(reqwest::header::LAST_MODIFIED));
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                body.extend_from_slice(&c);
                if body.len() > max {
                    return Got::Skip("over the size limit".into());
                }
            }
            Ok(None) => break,
            Err(e) => return Got::Fail(format!("reading the body: {}", root_cause(&e))),
        }
    }
    if body[..body.len().min(1024)].contains(&0) {
        return Got::Skip("binary content".into());
    }
    let text = String::from_utf8_lossy(&body).into_owned();
    if !markdown && extract::nesting(&text) > extract::MAX_OPEN {
        return Got::Skip("nested too deeply".into());
    }
    let base = at.clone();
    let parsed = tokio::task::spawn_blocking(move || {
        if markdown {
            let name = base.path_segments().and_then(|mut s| s.next_back()).unwrap_or("").to_owned();
            extract::markdown(&text, &base, &name)
        } else {
            extract::html(&text, &base)
        }
    })
    .await;
    match parsed {
        Ok(page) => Got::Page { url: at, page: Box::new(page), etag, last_modified },
        Err(e) => Got::Fail(format!("parsing: {e}")),
    }
}

/// The innermost error's message.
fn root_cause(e: &dyn std::error::Error) -> String {
    let mut e = e;
    while let Some(inner) = e.source() {
        e = inner;
    }
    e.to_string()
}

/// The URLs of sitemaps (following sitemap indexes one level), as far as they answer.
async fn sitemap_urls(client: &reqwest::Client, maps: &[String], max: usize) -> Vec<url::Url> {
    let mut out = Vec::new();
    let mut queue: VecDeque<(String, bool)> = maps.iter().map(|m| (m.clone(), true)).collect();
    let mut done = HashSet::new();
    while let Some((map, nested)) = queue.pop_front() {
        if !done.insert(map.clone()) || done.len() > 50 {
            continue;
        }
        let Ok(resp) = client.get(&map).send().await else { continue };
        if !resp.status().is_success() || resp.content_length().is_some_and(|n| n > max as u64) {
            continue;
        }
        let Ok(text) = resp.text().await else { continue };
        let (locs, index) = locs(&text);
        for l in locs {
            if index {
                if nested {
                    queue.push_back((l, false));
                }
            } else if let Ok(u) = url::Url::parse(&l) {
                out.push(u);
            }
        }
    }
    out
}

/// A sitemap's `<loc>`s, and whether it is a sitemap index.
fn locs(xml: &str) -> (Vec<String>, bool) {
    let mut reader = quick_xml::Reader::from_str(xml);
    let (mut out, mut index, mut inside) = (Vec::new(), false, false);
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Start(e)) => {
                let name = e.local_name();
                index |= name.as_ref() == b"sitemapindex";
                inside = name.as_ref() == b"loc";
            }
            Ok(quick_xml::events::Event::Text(t)) if inside => {
                if let Ok(s) = t.decode() {
                    out.push(s.trim().to_owned());
                }
            }
            Ok(quick_xml::events::Event::End(_)) => inside = false,
            Ok(quick_xml::events::Event::Eof) | Err(_) => break,
            _ => {}
        }
    }
    (out, index)
}

/// Writes pages into a source's directory and keeps its state.
pub(crate) struct Recorder<'a> {
    dir: &'a SourceDir,
    prefix: String,
    pub(crate) state: State,
    pub(crate) id: u64,
    pub(crate) counts: Counts,
    files: BTreeSet<String>,
    unsaved: u64,
    started: Instant,
}

impl<'a> Recorder<'a> {
    /// Opens `dir`'s state: an interrupted crawl goes on under its id.
    pub(crate) fn open(dir: &'a SourceDir, prefix: &str) -> Result<Recorder<'a>> {
        let mut state = dir.state()?;
        // A new crawl's id is later than every earlier one's (two crawls may share a second).
        let latest = state.pages.values().map(|p| p.crawl).max().unwrap_or(0);
        let id = state.unfinished.unwrap_or_else(|| crate::now().max(latest + 1));
        state.unfinished = Some(id);
        dir.save_state(&state)?;
        let files = state.pages.values().map(|p| p.file.clone()).collect();
        Ok(Recorder {
            dir,
            prefix: prefix.to_owned(),
            state,
            id,
            counts: Counts::default(),
            files,
            unsaved: 0,
            started: Instant::now(),
        })
    }

    /// Whether `url` was taken this crawl.
    pub(crate) fn done(&self, url: &str) -> bool {
        self.state.pages.get(url).is_some_and(|p| p.crawl == self.id)
    }

    /// Keeps a known page as it is (a `304`); its links.
    pub(crate) fn keep(&mut self, url: &str) -> Vec<String> {
        match self.state.pages.get_mut(url) {
            Some(p) => {
                p.crawl = self.id;
                p.links.clone()
            }
            None => Vec::new(),
        }
    }

    /// Records a page read at `url`: written when new or changed.
    pub(crate) fn record(
        &mut self,
        url: &str,
        depth: u32,
        page: &Extracted,
        links: Vec<String>,
        etag: Option<String>,
        last_modified: Option<String>,
    ) -> Result<()> {
        let hash = crate::pages::hex(&crate::pages::sha256(page.markdown.as_bytes()));
        let file = match self.state.pages.get(url) {
            Some(p) => p.file.clone(),
            None => crate::pages::file_for(url, &self.prefix, &self.files),
        };
        let same = self.state.pages.get(url).is_some_and(|p| p.hash == hash) && self.dir.pages().join(&file).is_file();
        if same {
            self.counts.unchanged += 1;
        } else {
            self.dir.write_page(&file, &page.markdown)?;
            self.counts.written += 1;
        }
        self.files.insert(file.clone());
        let entry = PageState {
            file,
            title: page.title.clone(),
            etag,
            last_modified,
            hash,
            links,
            depth,
            crawl: self.id,
            headings: page.headings.clone(),
        };
        self.state.pages.insert(url.to_owned(), entry);
        self.unsaved += 1;
        Ok(())
    }

    /// Saves the state every few pages.
    pub(crate) fn save_now_and_then(&mut self) -> Result<()> {
        if self.unsaved >= SAVE_EVERY {
            self.unsaved = 0;
            self.dir.save_state(&self.state)?;
        }
        Ok(())
    }

    /// Stops the crawl where it is: its state saved, to be resumed.
    pub(crate) fn stop(&mut self) -> Result<()> {
        self.dir.save_state(&self.state)
    }

    /// Ends the crawl: pages it did not reach are removed; the state says it is complete.
    pub(crate) fn finish(mut self) -> Result<Counts> {
        let gone: Vec<String> =
            self.state.pages.iter().filter(|(_, p)| p.crawl != self.id).map(|(u, _)| u.clone()).collect();
        for u in gone {
            if let Some(p) = self.state.pages.remove(&u) {
                self.dir.remove_page(&p.file);
                self.counts.removed += 1;
            }
        }
        self.state.unfinished = None;
        self.state.finished_at = Some(crate::now());
        self.state.last = self.counts.clone();
        self.dir.save_state(&self.state)?;
        tracing::info!(
            pages = self.state.pages.len(),
            seconds = self.started.elapsed().as_secs_f64(),
            "docs source updated"
        );
        Ok(self.counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_sitemaps() {
        let u = |s: &str| url::Url::parse(s).unwrap();
        assert_eq!(default_prefix(&u("https://d.example/lib/guide/intro.html")), "https://d.example/lib/guide/");
        assert_eq!(default_prefix(&u("https://d.example/lib/")), "https://d.example/lib/");
        assert_eq!(default_prefix(&u("https://d.example")), "https://d.example/");
        assert_eq!(default_prefix(&u("https://d.example/llms.txt")), "https://d.example/");
        let (l, index) = locs(
            r#"<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
            <url><loc> https://d.example/a.html </loc></url><url><loc>https://d.example/b.html</loc></url></urlset>"#,
        );
        assert_eq!(
            (l, index),
            (vec!["https://d.example/a.html".to_owned(), "https://d.example/b.html".to_owned()], false)
        );
        let (l, index) = locs("<sitemapindex><sitemap><loc>https://d.example/s1.xml</loc></sitemap></sitemapindex>");
        assert_eq!((l, index), (vec!["https://d.example/s1.xml".to_owned()], true));
    }
}
