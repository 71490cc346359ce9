//! Documentation sources on a team server (@Docs): a tenant adds a docs site once
//! (`POST /v1/docs/sources`), the server crawls and indexes it, and every member searches it
//! (`POST /v1/docs/search`, the query in the body, never in a URL).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `POST /v1/docs/sources`: a docs site to crawl.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddDocsSource {
    /// Its name (`@Docs NAME`): letters, digits, `.`, `_` and `-`, at most 64.
    pub name: String,
    /// Where the crawl starts (`http`/`https`; the server's network rules for runs apply).
    pub url: String,
    /// Only URLs starting with this are pages (default: the URL's directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Links followed from the start, at most (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 64))]
    pub depth: Option<u32>,
    /// Pages kept, at most (default 2,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_pages: Option<u32>,
    /// Requests a second, at most (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// How often it is crawled again (`7d`, `12h`; default: only when asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<String>,
}

/// Where a source's update stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DocsState {
    /// Added or asked for, not started yet.
    Queued,
    /// Being crawled and indexed.
    Updating,
    /// Searchable; the last update ended.
    Ready,
    /// The last update failed (`error` says why); what it had before is still searched.
    Failed,
}

/// What an update counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DocsCounts {
    /// URLs found in scope.
    pub found: u64,
    /// Requests answered.
    pub fetched: u64,
    /// Pages written (new or changed).
    pub written: u64,
    /// Pages unchanged (`304`, or the same content).
    pub unchanged: u64,
    /// Pages removed (gone from the site).
    pub removed: u64,
    /// URLs skipped, by why.
    #[serde(default)]
    pub skipped: BTreeMap<String, u64>,
    /// URLs that failed, by why.
    #[serde(default)]
    pub failed: BTreeMap<String, u64>,
}

/// A source as the server keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DocsSource {
    /// Its name.
    pub name: String,
    /// Where the crawl starts.
    pub url: String,
    /// The URL prefix of its pages.
    pub prefix: String,
    /// How often it is crawled again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<String>,
    /// Where its update stands.
    pub state: DocsState,
    /// Pages kept.
    pub pages: u64,
    /// When its last complete update ended (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<u64>,
    /// What the last update counted.
    pub last: DocsCounts,
    /// Why the last update failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/docs/sources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DocsSourceList {
    /// The tenant's sources, by name.
    pub sources: Vec<DocsSource>,
}

/// `POST /v1/docs/search`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DocsSearch {
    /// The question or keywords (held in memory only).
    pub query: String,
    /// The sources searched (none: all of the tenant's).
    #[serde(default)]
    pub names: Vec<String>,
    /// Hits wanted (1-100, default 8).
    #[serde(default = "default_k")]
    #[schemars(range(min = 1, max = 100))]
    pub k: u32,
}

fn default_k() -> u32 {
    8
}

/// A documentation hit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DocsHit {
    /// The page's URL, with the anchor of the heading above the hit.
    pub url: String,
    /// The page's title.
    pub title: String,
    /// The headings above the hit, outermost first, ` > ` between.
    pub heading: String,
    /// The hit's text (Markdown).
    pub text: String,
    /// Its score (higher is better).
    pub score: f32,
    /// The source's name.
    pub source: String,
}

/// Hits, best first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DocsHits {
    /// The hits.
    pub hits: Vec<DocsHit>,
}
