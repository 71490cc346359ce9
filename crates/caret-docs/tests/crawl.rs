//! Crawls of a real documentation site — SQLite's, as Debian ships it (`sqlite3-doc`;
//! `CARET_TEST_SQLITE_DOCS`, default `/usr/share/doc/sqlite3`) — served from loopback with
//! `ETag`s, beside hand-made bad pages: a redirect loop, a 500, a 50 MB page, binary content
//! under an `.html` name, elements nested 20,000 deep, a path `robots.txt` disallows, links leaving the prefix, a page
//! only the sitemap names. Then an interrupted crawl resumed without fetching a page twice,
//! a refresh (one page changed, one removed) costing one request a page, and a local folder.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::Response;
use caret_docs::crawl::{Settings, crawl};
use caret_docs::pages::{Counts, SourceDir};
use caret_test_support::TempDir;

fn sqlite_docs() -> Option<PathBuf> {
    caret_test_support::sqlite_docs()
}

/// The site: `/docs/` is the documentation (plus what `pages` puts or hides there).
#[derive(Clone)]
struct Site {
    root: PathBuf,
    /// Pages served instead of the files (`None`: gone, 404).
    pages: Arc<Mutex<HashMap<String, Option<String>>>>,
    /// Requests by path, and how many were answered `304`.
    log: Arc<Mutex<(BTreeMap<String, u32>, u32)>>,
}

const START: &str = r#"<html><head><title>Start</title></head><body><main>
<h1>Start here</h1><p>The SQLite documentation, and some bad pages.</p>
<a href="index.html">SQLite home</a> <a href="lang_select.html">SELECT</a>
<a href="loop-a.html">loop</a> <a href="broken.html">broken</a> <a href="huge.html">huge</a>
<a href="binary.html">binary</a> <a href="private/secret.html">private</a> <a href="deep.html">deep</a>
<a href="_sources/start.rst.txt">Show Source</a>
<a href="/elsewhere/page.html">outside the prefix</a> <a href="https://example.org/">another site</a>
</main></body></html>"#;

async fn serve(site: Site, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path().to_owned();
    *site.log.lock().unwrap().0.entry(path.clone()).or_default() += 1;
    let html = |status: StatusCode, body: Body| {
        Response::builder().status(status).header(header::CONTENT_TYPE, "text/html; charset=utf-8").body(body).unwrap()
    };
    match path.as_str() {
        "/robots.txt" => return Response::new(Body::from("User-agent: *\nDisallow: /docs/private/\n")),
        "/sitemap.xml" => {
            let xml = "<urlset><url><loc>http://HOST/docs/orphan.html</loc></url></urlset>";
            let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
            return Response::new(Body::from(xml.replace("HOST", host)));
        }
        "/llms.txt" => {
            let text = "# Lib\n\n> A library.\n\n## Docs\n\n- [Guide](/guide.md): start here\n- [SELECT](/docs/lang_select.html)\n";
            return Response::builder().header(header::CONTENT_TYPE, "text/plain").body(Body::from(text)).unwrap();
        }
        "/guide.md" => {
            let text = "# Guide\n\nInstall it, then [read more](/docs/lang_update.html).\n\n## Usage\n\nCall it.\n";
            return Response::builder().header(header::CONTENT_TYPE, "text/markdown").body(Body::from(text)).unwrap();
        }
        "/docs/loop-a.html" => return redirect("/docs/loop-b.html"),
        "/docs/loop-b.html" => return redirect("/docs/loop-a.html"),
        "/docs/broken.html" => return html(StatusCode::INTERNAL_SERVER_ERROR, Body::from("oops")),
        "/docs/huge.html" => {
            // 50 MB without a Content-Length: the crawler must stop reading by itself.
            let chunk = bytes::Bytes::from(vec![b'x'; 1 << 20]);
            let stream = futures::stream::iter((0..50).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
            return html(StatusCode::OK, Body::from_stream(stream));
        }
        "/docs/binary.html" => return html(StatusCode::OK, Body::from(vec![0u8, 159, 146, 150, 0, 1, 2, 3])),
        // Elements nested 20,000 deep (the parser would take minutes over it).
        "/docs/deep.html" => return html(StatusCode::OK, Body::from("<div>".repeat(20_000) + "x")),
        _ => {}
    }
    let Some(rel) = path.strip_prefix("/docs/") else { return html(StatusCode::NOT_FOUND, Body::empty()) };
    let rel = if rel.is_empty() { "start.html" } else { rel };
    let text = match site.pages.lock().unwrap().get(rel) {
        Some(Some(t)) => t.clone(),
        Some(None) => return html(StatusCode::NOT_FOUND, Body::empty()),
        None if rel == "start.html" => START.to_owned(),
        None if rel == "orphan.html" => {
            "<title>Orphan</title><main><p>Only the sitemap knows me.</p></main>".to_owned()
        }
        None => match std::fs::read(site.root.join(rel)) {
            Ok(b) if !rel.contains("..") => String::from_utf8_lossy(&b).into_owned(),
            _ => return html(StatusCode::NOT_FOUND, Body::empty()),
        },
    };
    let etag = format!("\"{:x}\"", fxhash(&text));
    if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        site.log.lock().unwrap().1 += 1;
        return Response::builder()
            .status(StatusCode::NOT_MODIFIED)
            .header(header::ETAG, etag)
            .body(Body::empty())
            .unwrap();
    }
    let kind = if rel.ends_with(".html") { "text/html; charset=utf-8" } else { "application/octet-stream" };
    Response::builder().header(header::CONTENT_TYPE, kind).header(header::ETAG, etag).body(Body::from(text)).unwrap()
}

fn redirect(to: &str) -> Response {
    Response::builder().status(StatusCode::FOUND).header(header::LOCATION, to).body(Body::empty()).unwrap()
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

async fn start_site(root: PathBuf) -> (String, Site) {
    let site = Site { root, pages: Arc::default(), log: Arc::default() };
    let app = axum::Router::new().fallback({
        let site = site.clone();
        move |uri: Uri, headers: HeaderMap| serve(site.clone(), uri, headers)
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/docs/start.html"), site)
}

fn settings(start: &str, max_pages: usize) -> Settings {
    let mut s = Settings::new(url::Url::parse(start).unwrap());
    s.max_pages = max_pages;
    s.depth = 3;
    s.rate = 1000.0;
    s.concurrency = 8;
    s
}

fn go_on(_: &Counts) -> ControlFlow<()> {
    ControlFlow::Continue(())
}

#[tokio::test]
async fn a_docs_site_is_crawled_resumed_and_refreshed() {
    let Some(root) = sqlite_docs() else { return };
    let (start, site) = start_site(root).await;
    let dir = TempDir::new();
    let source = SourceDir::new(dir.join("src"));

    // Interrupted after 30 pages, then resumed: no page is fetched twice.
    let mut seen = 0;
    let stopped = crawl(&source, &settings(&start, 120), &mut |c: &Counts| {
        seen = c.written;
        if c.written >= 30 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    })
    .await;
    assert!(matches!(stopped, Err(caret_docs::Error::Stopped)), "{stopped:?}");
    assert!(seen >= 30, "{seen}");
    assert!(source.state().unwrap().unfinished.is_some());
    let counts = crawl(&source, &settings(&start, 120), &mut go_on).await.unwrap();
    assert!(counts.resumed >= 30, "{counts:?}");
    // What was kept, and what was counted.
    let state = source.state().unwrap();
    let (log, _) = site.log.lock().unwrap().clone();
    let kept = |path: &str| state.pages.keys().any(|u| u.ends_with(path));
    let twice: Vec<_> = log.iter().filter(|(p, n)| **n > 1 && kept(p)).collect();
    assert!(twice.is_empty(), "pages fetched twice: {twice:?}");
    assert!(state.unfinished.is_none());
    let pages = state.pages.len();
    assert!((100..=120).contains(&pages), "{pages} pages; {counts:?}");
    assert_eq!(counts.failed.get("HTTP 500"), Some(&1), "{counts:?}");
    assert_eq!(counts.failed.get("too many redirects (a loop?)"), Some(&1), "{counts:?}");
    assert_eq!(counts.skipped.get("over the size limit"), Some(&1), "{counts:?}");
    assert_eq!(counts.skipped.get("binary content"), Some(&1), "{counts:?}");
    assert_eq!(counts.skipped.get("nested too deeply"), Some(&1), "{counts:?}");
    assert_eq!(counts.skipped.get("disallowed by robots.txt"), Some(&1), "{counts:?}");
    assert_eq!(counts.skipped.get("a page's source (Sphinx `_sources/`)"), Some(&1), "{counts:?}");
    assert!(!log.keys().any(|p| p.contains("_sources")), "a page's source is not even asked for");
    assert!(counts.skipped.get("over the page limit").is_some_and(|n| *n > 0), "{counts:?}");
    let urls: Vec<&String> = state.pages.keys().collect();
    assert!(urls.iter().all(|u| u.contains("/docs/")), "only the prefix: {urls:?}");
    assert!(urls.iter().any(|u| u.ends_with("/docs/orphan.html")), "the sitemap's page");
    assert!(!log.contains_key("/docs/private/secret.html") && !log.contains_key("/elsewhere/page.html"));
    let select = state.pages.iter().find(|(u, _)| u.ends_with("/docs/lang_select.html")).unwrap().1;
    let md = std::fs::read_to_string(source.pages().join(&select.file)).unwrap();
    assert!(md.starts_with("# SELECT\n") && md.contains("The SELECT statement is used to query the database."), "{md}");
    assert!(!md.contains("Small. Fast. Reliable."), "the navigation is dropped");
    let overview = select.headings.iter().find(|h| h.text == "1. Overview").unwrap();
    assert_eq!(overview.anchor.as_deref(), Some("overview"));
    assert!(md.lines().nth(overview.line as usize - 1).unwrap().ends_with("Overview"));

    // A refresh: one page changed, one gone; the rest one conditional request each (304).
    let original = std::fs::read_to_string(site.root.join("lang_select.html")).unwrap();
    let changed = original.replace("The SELECT statement is used to query the database.", "Rewritten.");
    site.pages.lock().unwrap().insert("lang_select.html".into(), Some(changed));
    site.pages.lock().unwrap().insert("orphan.html".into(), None);
    *site.log.lock().unwrap() = Default::default();
    let refresh = crawl(&source, &settings(&start, 120), &mut go_on).await.unwrap();
    let (_, not_modified) = *site.log.lock().unwrap();
    assert_eq!((refresh.written, refresh.removed), (1, 1), "{refresh:?}");
    assert_eq!(refresh.failed.get("HTTP 404"), Some(&1), "{refresh:?}");
    assert_eq!(refresh.unchanged as usize, pages - 2, "{refresh:?}");
    assert!(not_modified as usize >= pages - 3, "{not_modified} answered 304; {refresh:?}");
    let md = std::fs::read_to_string(source.pages().join(&select.file)).unwrap();
    assert!(md.contains("Rewritten."));
    assert!(!source.state().unwrap().pages.keys().any(|u| u.ends_with("orphan.html")));
}

/// An `llms.txt`: it and the pages it links (Markdown or HTML) are the source; links inside
/// those pages are not followed.
#[tokio::test]
async fn an_llms_txt_brings_the_pages_it_links() {
    let Some(root) = sqlite_docs() else { return };
    let (start, _site) = start_site(root).await;
    let llms = start.replace("/docs/start.html", "/llms.txt");
    let dir = TempDir::new();
    let source = SourceDir::new(dir.join("src"));
    let mut s = settings(&llms, 100);
    s.prefix = llms.trim_end_matches("llms.txt").to_owned();
    let counts = crawl(&source, &s, &mut go_on).await.unwrap();
    let state = source.state().unwrap();
    let files: Vec<&str> = state.pages.values().map(|p| p.file.as_str()).collect();
    assert_eq!(files, ["docs/lang_select.md", "guide.md", "llms.md"], "{counts:?}");
    let guide = state.pages.values().find(|p| p.file == "guide.md").unwrap();
    assert_eq!(
        guide.headings.iter().map(|h| (h.line, h.text.as_str())).collect::<Vec<_>>(),
        [(1, "Guide"), (5, "Usage")]
    );
}

#[tokio::test]
async fn a_start_page_that_does_not_answer_is_an_error() {
    let dir = TempDir::new();
    let source = SourceDir::new(dir.join("src"));
    let err = crawl(&source, &settings("http://127.0.0.1:9/docs/", 10), &mut go_on).await.unwrap_err();
    assert!(err.to_string().starts_with("fetching http://127.0.0.1:9/docs/"), "{err}");
}

#[test]
fn a_local_folder_of_html_markdown_and_rst_is_read() {
    let dir = TempDir::new();
    dir.write("docs/guide.md", "# Guide\n\nUse `lib.load`.\n\n## Errors\n\nThey raise.\n");
    dir.write(
        "docs/api/index.html",
        "<title>API</title><nav>menu</nav><main><h2 id='load'>load</h2><p>Loads.</p></main>",
    );
    dir.write("docs/notes.rst", "Notes\n=====\n\nKeep these.\n");
    dir.write("docs/logo.png", "\u{0}PNG");
    dir.write("docs/.hidden.md", "# no\n");
    let source = SourceDir::new(dir.join("src"));
    let counts = caret_docs::local::import(&source, &dir.join("docs"), &mut go_on).unwrap();
    assert_eq!((counts.written, counts.found), (3, 3), "{counts:?}");
    let state = source.state().unwrap();
    let files: Vec<&str> = state.pages.values().map(|p| p.file.as_str()).collect();
    assert_eq!(files, ["api/index.md", "guide.md", "notes.md"]);
    let api = std::fs::read_to_string(source.pages().join("api/index.md")).unwrap();
    assert_eq!(api, "# API\n\n## load\n\nLoads.\n");
    let notes = std::fs::read_to_string(source.pages().join("notes.md")).unwrap();
    assert_eq!(notes, "# Notes\n\nKeep these.\n");
    // Again: nothing written; a file removed leaves.
    std::fs::remove_file(dir.join("docs/notes.rst")).unwrap();
    let again = caret_docs::local::import(&source, &dir.join("docs"), &mut go_on).unwrap();
    assert_eq!((again.written, again.unchanged, again.removed), (0, 2, 1), "{again:?}");
    assert!(!source.pages().join("notes.md").exists());
}
