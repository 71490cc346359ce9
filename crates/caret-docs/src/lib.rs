//! Documentation sources for @Docs: a docs site crawled ([`crawl`]: same origin, under a
//! prefix, breadth first, `robots.txt`, `sitemap.xml`, `llms.txt`, a polite rate, conditional
//! requests on a refresh, resumable) or a local folder ([`local`]), each page's main content
//! turned into Markdown with its headings and their anchors ([`extract`]) and kept as a page
//! file of a source's directory ([`pages`]), which the index then takes like a workspace.
//!
//! Never indexes, embeds or searches: it makes the pages.

pub mod crawl;
pub mod extract;
pub mod local;
pub mod pages;
pub mod robots;

use std::path::{Path, PathBuf};

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file of the source's directory cannot be read as such.
    #[error("{0} is damaged: remove it, or the source, and add it again")]
    Corrupt(String),
    /// The request makes no sense (a URL that is not http(s), a folder that is not one).
    #[error("{0}")]
    BadRequest(String),
    /// Stopped when asked (the state is saved: the next update resumes).
    #[error("stopped; the next update goes on from here")]
    Stopped,
    /// The crawl could not start (its first page did not answer).
    #[error("fetching {url}: {why}")]
    Fetch {
        /// The URL.
        url: String,
        /// Why.
        why: String,
    },
}

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io { path: path.to_path_buf(), source }
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Seconds since the Unix epoch.
pub(crate) fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
