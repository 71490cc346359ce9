//! A source's directory: `source.json` (what to crawl or read), `state.json` (each page's
//! file, validators, content hash, links and headings; an unfinished crawl's progress) and
//! `pages/` (one Markdown file per page, named after its URL under the prefix). The index
//! takes `pages/` like a workspace; search hits map back to a page's URL and heading through
//! the state. Files are written atomically (a temporary file renamed into place).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::extract::Heading;
use crate::{Error, Result};

/// What a source is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Origin {
    /// A docs site (or an `llms.txt`), crawled.
    Site {
        /// Where the crawl starts.
        url: String,
        /// Only URLs starting with this are pages of the source.
        prefix: String,
        /// Links followed from the start, at most.
        depth: u32,
        /// Pages kept, at most.
        max_pages: usize,
        /// Requests a second, at most (a site's `Crawl-delay` may lower it).
        rate: f64,
    },
    /// A folder of HTML, Markdown or reStructuredText files.
    Folder {
        /// Its absolute path.
        path: PathBuf,
    },
}

/// A source's settings (`source.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    /// Its name (`@Docs NAME`).
    pub name: String,
    /// What it is.
    pub origin: Origin,
    /// How often it is crawled again (`7d`; none: only when asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<String>,
}

/// What the last crawl kept of a page.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageState {
    /// Its file under `pages/`.
    pub file: String,
    /// Its title.
    pub title: String,
    /// `ETag` it came with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// `Last-Modified` it came with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<String>,
    /// SHA-256 of its Markdown, hex.
    pub hash: String,
    /// Links from it (for a crawl that does not fetch it again).
    #[serde(default)]
    pub links: Vec<String>,
    /// Its distance from the start.
    pub depth: u32,
    /// The crawl that last reached it.
    pub crawl: u64,
    /// Its headings.
    #[serde(default)]
    pub headings: Vec<Heading>,
}

/// A source's state (`state.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Pages by URL.
    pub pages: BTreeMap<String, PageState>,
    /// The crawl under way (its id, a Unix time), when one was interrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfinished: Option<u64>,
    /// When the last complete crawl ended (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// What it counted.
    #[serde(default)]
    pub last: Counts,
}

/// What a crawl did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// URLs found in scope.
    pub found: u64,
    /// Requests answered.
    pub fetched: u64,
    /// Pages written (new or changed).
    pub written: u64,
    /// Pages unchanged (a `304`, or the same content).
    pub unchanged: u64,
    /// Pages taken from an interrupted crawl without fetching them again.
    pub resumed: u64,
    /// Pages removed (gone from the site).
    pub removed: u64,
    /// URLs skipped, by why (robots, not HTML, too large, binary, a redirect out, …).
    pub skipped: BTreeMap<String, u64>,
    /// URLs that failed, by why (HTTP status, a redirect loop, a timeout, …).
    pub failed: BTreeMap<String, u64>,
}

/// A source's directory.
#[derive(Debug, Clone)]
pub struct SourceDir {
    /// Its root.
    pub root: PathBuf,
}

impl SourceDir {
    /// The directory at `root`.
    pub fn new(root: impl Into<PathBuf>) -> SourceDir {
        SourceDir { root: root.into() }
    }

    /// Where the pages are (the directory the index takes).
    pub fn pages(&self) -> PathBuf {
        self.root.join("pages")
    }

    /// Its settings.
    pub fn source(&self) -> Result<Source> {
        let path = self.root.join("source.json");
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt(format!("{}: {e}", path.display())))
    }

    /// Saves its settings.
    pub fn save_source(&self, source: &Source) -> Result<()> {
        write_atomic(&self.root.join("source.json"), &serde_json::to_vec_pretty(source).unwrap_or_default())
    }

    /// Its state (empty when none was saved; a corrupt one is an error naming the file).
    pub fn state(&self) -> Result<State> {
        let path = self.root.join("state.json");
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    /// Saves its state.
    pub fn save_state(&self, state: &State) -> Result<()> {
        write_atomic(&self.root.join("state.json"), &serde_json::to_vec(state).unwrap_or_default())
    }

    /// Writes a page's Markdown to `file` under `pages/`.
    pub fn write_page(&self, file: &str, markdown: &str) -> Result<()> {
        write_atomic(&self.pages().join(file), markdown.as_bytes())
    }

    /// Removes a page's file (and directories it leaves empty).
    pub fn remove_page(&self, file: &str) {
        let path = self.pages().join(file);
        let _ = std::fs::remove_file(&path);
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| *d != self.pages()) {
            if std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
}

/// Writes `bytes` to `path` through a temporary file beside it.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// A page's file for `url` under `prefix`: its path with `.html` made `.md`, a directory's
/// page `index.md`, a query kept as a short hash; each segment cleaned; unique in `taken`.
pub fn file_for(url: &str, prefix: &str, taken: &BTreeSet<String>) -> String {
    let (path, query) = match url.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (url, None),
    };
    let rel = path.strip_prefix(prefix).unwrap_or_else(|| path.rsplit('/').next().unwrap_or(path));
    let rel = rel.trim_start_matches('/');
    let mut segments: Vec<String> = rel
        .split('/')
        .filter(|s| !s.is_empty() && *s != "." && *s != "..")
        .map(|s| {
            s.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).take(100).collect()
        })
        .collect();
    if rel.is_empty() || rel.ends_with('/') {
        segments.push("index".to_owned());
    }
    let last = segments.pop().unwrap_or_else(|| "index".to_owned());
    let stem = ["html", "htm", "md", "markdown", "txt", "rst", "xhtml"]
        .iter()
        .find_map(|ext| last.strip_suffix(&format!(".{ext}")))
        .unwrap_or(&last)
        .to_owned();
    let stem = match query {
        Some(q) => format!("{stem}-{}", &short_hash(q)),
        None => stem,
    };
    segments.push(format!("{stem}.md"));
    let mut file = segments.join("/");
    if taken.contains(&file) {
        file = format!("{}-{}.md", file.trim_end_matches(".md"), short_hash(url));
    }
    file
}

/// The first 8 hex digits of SHA-256.
fn short_hash(s: &str) -> String {
    hex(&sha256(s.as_bytes()))[..8].to_owned()
}

/// SHA-256 of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).into()
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_files_follow_their_urls_and_stay_unique() {
        let p = "https://docs.example.com/lib/";
        let mut taken = BTreeSet::new();
        let mut check = |url: &str, want: &str| {
            let f = file_for(url, p, &taken);
            assert!(f.starts_with(want.trim_end_matches("*")), "{url} → {f}");
            taken.insert(f);
        };
        check("https://docs.example.com/lib/", "index.md");
        check("https://docs.example.com/lib/guide/intro.html", "guide/intro.md");
        check("https://docs.example.com/lib/guide/", "guide/index.md");
        check("https://docs.example.com/lib/api/Foo%20Bar.htm", "api/Foo_20Bar.md");
        check("https://docs.example.com/lib/search.html?q=x", "search-*");
        check("https://docs.example.com/lib/guide/intro.htm", "guide/intro-*");
        check("https://docs.example.com/lib/../../etc/passwd", "etc/passwd.md");
    }
}
