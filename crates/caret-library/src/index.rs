//! A source's pages in an index: synced like a workspace (the same chunking and hybrid
//! search as code), embedded when the index embeds, and a search hit mapped back to its page's
//! URL (with the anchor of the heading above it), title, heading path and text.

use std::sync::Arc;

use anyhow::Context as _;
use caret_client::state::WorkspaceState;
use caret_client::sync::{SyncEngine, SyncOptions};
use caret_client::transport::Transport;
use caret_docs::pages::State;
use caret_protocol::docs::DocsHit;
use caret_workspace::scan::Scanner;

/// What the index did, summed over the steps of an update.
#[derive(Debug, Default)]
pub struct Totals {
    /// Files added, changed, removed.
    pub synced: (u64, u64, u64),
    /// Chunks embedded.
    pub embedded: u64,
    /// Chunks of the source, and those with vectors, at the last look.
    pub vectors: (u64, u64),
    /// The embedding model (none: nothing embedded).
    pub model: Option<String>,
}

/// Keeping a source's pages in an index.
#[derive(Clone)]
pub struct Index {
    engine: Arc<SyncEngine>,
    scanner: Arc<Scanner>,
    transport: Arc<dyn Transport>,
    embed: bool,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index").field("embed", &self.embed).finish_non_exhaustive()
    }
}

impl Index {
    /// The index behind `transport`, its pages read by `scanner` and synced in batches of
    /// `options`; `embed`: vectors too.
    pub fn new(scanner: Arc<Scanner>, options: SyncOptions, transport: Arc<dyn Transport>, embed: bool) -> Index {
        Index { engine: Arc::new(SyncEngine::new(scanner.clone(), options)), scanner, transport, embed }
    }

    /// Whether it embeds.
    pub fn embeds(&self) -> bool {
        self.embed
    }

    /// A sync of the pages of `ws`.
    pub async fn sync(&self, ws: &WorkspaceState, totals: &mut Totals) -> anyhow::Result<()> {
        let r = self.engine.sync(ws, self.transport.as_ref()).await.context("indexing the pages")?;
        totals.synced = (totals.synced.0 + r.added, totals.synced.1 + r.modified, totals.synced.2 + r.deleted);
        Ok(())
    }

    /// The embedding of every chunk of `ws` that lacks a vector.
    pub async fn embed(&self, ws: &WorkspaceState, totals: &mut Totals) -> anyhow::Result<()> {
        let report = caret_client::index::embed_missing(self.scanner.clone(), ws, self.transport.as_ref(), |_| {})
            .await
            .context("embedding the pages")?;
        totals.embedded += report.progress.embedded;
        totals.vectors = (report.progress.total, report.progress.done);
        totals.model = report.model;
        Ok(())
    }

    /// A sync, then (when embedding) the embedding of what it brought.
    pub async fn step(&self, ws: &WorkspaceState, totals: &mut Totals) -> anyhow::Result<()> {
        self.sync(ws, totals).await?;
        if self.embed {
            self.embed(ws, totals).await?;
        }
        Ok(())
    }
}

/// A search hit of a source's pages as a documentation hit (`None`: not a page any more).
pub fn hit(source: &str, state: &State, h: caret_client::index::Hit) -> Option<DocsHit> {
    let (url, page) = state.pages.iter().find(|(_, p)| p.file == h.path)?;
    // The headings above the hit's first line, innermost last.
    let mut path: Vec<&caret_docs::extract::Heading> = Vec::new();
    for heading in page.headings.iter().filter(|x| x.line > 0 && x.line <= h.start_line) {
        path.retain(|p| p.level < heading.level);
        path.push(heading);
    }
    // The page's own title heading is the title, not a heading.
    let shown: Vec<&str> =
        path.iter().filter(|x| !(x.line == 1 && x.text == page.title)).map(|x| x.text.as_str()).collect();
    let anchor = path.iter().rev().find_map(|x| x.anchor.as_deref());
    let url = match anchor {
        Some(a) => format!("{url}#{a}"),
        None => url.clone(),
    };
    Some(DocsHit {
        url,
        title: page.title.clone(),
        heading: shown.join(" > "),
        text: h.snippet,
        score: h.score,
        source: source.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use caret_docs::extract::Heading;
    use caret_docs::pages::PageState;

    use super::*;

    fn heading(line: u32, level: u8, text: &str, anchor: Option<&str>) -> Heading {
        Heading { line, level, text: text.into(), anchor: anchor.map(str::to_owned) }
    }

    fn state() -> State {
        let page = PageState {
            file: "guide/start.md".into(),
            title: "Getting started".into(),
            headings: vec![
                heading(1, 1, "Getting started", None),
                heading(5, 2, "Install", Some("install")),
                heading(9, 3, "From source", Some("from-source")),
                heading(20, 2, "Configure", None),
            ],
            ..PageState::default()
        };
        let mut state = State::default();
        state.pages.insert("https://docs.example/guide/start".into(), page);
        state
    }

    fn at(path: &str, line: u32) -> caret_client::index::Hit {
        caret_client::index::Hit {
            path: path.into(),
            start_line: line,
            end_line: line + 2,
            score: 0.5,
            snippet: "x".into(),
        }
    }

    #[test]
    fn a_hit_takes_the_headings_above_it_and_the_innermost_anchor() {
        let h = hit("guide", &state(), at("guide/start.md", 12)).unwrap();
        assert_eq!(h.url, "https://docs.example/guide/start#from-source");
        assert_eq!(h.heading, "Install > From source");
        assert_eq!(h.title, "Getting started");
        assert_eq!(h.source, "guide");
        // A sibling heading closes the one before it; one without an anchor takes the page's URL.
        let h = hit("guide", &state(), at("guide/start.md", 21)).unwrap();
        assert_eq!((h.url.as_str(), h.heading.as_str()), ("https://docs.example/guide/start", "Configure"));
        let h = hit("guide", &state(), at("guide/start.md", 2)).unwrap();
        assert_eq!(h.heading, "");
    }

    #[test]
    fn a_hit_of_a_page_gone_is_dropped() {
        assert!(hit("guide", &state(), at("guide/old.md", 3)).is_none());
    }
}
