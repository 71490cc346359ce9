//! Wire types shared by the client, the server and every front end. Data only: no logic, no
//! heavy dependencies.
//!
//! Hashes and ids travel as lowercase hex; paths in sync messages are always obfuscated
//! (`/`-separated segments of 26 base32 characters), never real file names.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod admin;
pub mod agent;
pub mod apply;
pub mod auth;
pub mod complete;
pub mod docs;
pub mod envs;
pub mod llm;
pub mod runs;
pub mod usage;

/// The header carrying the request's server key (see `caret-crypto`): the server derives chunk
/// ids and token hashes from it in memory and never stores it.
pub const SERVER_KEY_HEADER: &str = "x-caret-server-key";

/// The header on every answer naming the sync protocol's version the server speaks: 2 takes
/// chunk texts without their ids ([`ChunkText::id`] empty). Absent: version 1.
pub const SYNC_VERSION_HEADER: &str = "x-caret-sync-version";

/// The sync protocol's version this build speaks.
pub const SYNC_VERSION: u32 = 2;

/// The shape of an obfuscated path, as the server checks it (described in the API's schemas).
pub const OBFUSCATED_PATH: &str = "^[a-z0-9]{1,64}(/[a-z0-9]{1,64})*$";
/// An obfuscated directory path, or `""` for the root.
pub const OBFUSCATED_DIR: &str = "^([a-z0-9]{1,64}(/[a-z0-9]{1,64})*)?$";
/// A keyed hash or id: 32 bytes in hex.
pub const HEX32: &str = "^[0-9a-fA-F]{64}$";

/// An error body: a stable code and a safe message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// A stable error code and a message safe to show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorDetail {
    /// e.g. `not_found`, `unauthorized`, `rate_limited`, `bad_request`.
    pub code: String,
    /// Human-readable, never containing code or real paths.
    pub message: String,
}

/// Creates a workspace, or confirms an existing one (idempotent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CreateWorkspace {
    /// The public id of the workspace key, to detect a client using another key.
    pub key_id: String,
    /// On a client's first sync: the smallest keyed leaves of its tree (the first 16 hex
    /// characters of each, at most [`MAX_SKETCH`]). A new workspace whose sketch mostly
    /// matches the files of another workspace under the same key starts as a copy of it
    /// (a clone, a branch, a teammate's checkout), and the sync then sends only what differs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(regex(pattern = r"^[0-9a-f]{16}$")))]
    pub sketch: Vec<String>,
}

/// Entries a [`CreateWorkspace`] sketch holds at most.
pub const MAX_SKETCH: usize = 64;

/// A workspace as the server knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkspaceInfo {
    /// The workspace id (chosen by the client, 26 base32 characters).
    pub id: String,
    /// The public id of its key.
    pub key_id: String,
    /// Root hash of the server's tree (hex), empty tree included.
    pub root_hash: String,
    /// Files indexed.
    pub files: u64,
    /// Distinct chunks stored.
    pub chunks: u64,
    /// Distinct chunks of current files that could have a vector (absent from listings).
    #[serde(default)]
    pub embeddable: u64,
    /// How many of them have a vector by the server's embedding model.
    #[serde(default)]
    pub embedded: u64,
    /// The server's embedding model, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// Lists of the workspace's tree: the directories asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TreeRequest {
    /// Obfuscated directory paths (`""` is the root).
    #[schemars(inner(regex(pattern = OBFUSCATED_DIR)))]
    pub dirs: Vec<String>,
    /// The client's root hash: when the server's equals it, no listings are sent (a
    /// no-change sync costs one small round trip).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_root: Option<String>,
}

/// The server's view of the asked directories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TreeResponse {
    /// Root hash (hex).
    pub root_hash: String,
    /// One listing per asked directory, in order.
    pub dirs: Vec<DirListing>,
}

/// One directory's entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DirListing {
    /// The obfuscated path asked for.
    pub path: String,
    /// Whether it exists (as a directory) on the server.
    pub exists: bool,
    /// Its entries, sorted by name.
    pub entries: Vec<TreeEntry>,
}

/// An entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TreeEntry {
    /// Obfuscated name.
    pub name: String,
    /// Whether it is a directory.
    pub dir: bool,
    /// Its Merkle hash (hex): the file's leaf, or the directory's hash.
    pub hash: String,
}

/// A file to index: obfuscated path, keyed leaf, and its chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileMeta {
    /// Obfuscated path.
    #[schemars(regex(pattern = OBFUSCATED_PATH))]
    pub path: String,
    /// The keyed Merkle leaf (hex).
    #[schemars(regex(pattern = HEX32))]
    pub leaf: String,
    /// The file's chunks, in order (withheld chunks are absent).
    pub chunks: Vec<ChunkMeta>,
}

/// A chunk's metadata: where it is, never what it says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChunkMeta {
    /// Keyed chunk id (hex).
    #[schemars(regex(pattern = HEX32))]
    pub id: String,
    /// First line, 1-based.
    pub start_line: u32,
    /// Last line, 1-based, inclusive.
    pub end_line: u32,
    /// Language name (e.g. `rust`).
    pub language: String,
    /// File kind: `code`, `test`, `docs` or `config`.
    pub kind: String,
}

/// Which of these files' chunks does the server lack?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PlanRequest {
    /// The files about to be committed.
    pub files: Vec<FileMeta>,
}

/// The chunk ids the server lacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PlanResponse {
    /// Missing chunk ids (hex), each once.
    pub missing: Vec<String>,
}

/// A chunk's text, sent only when the server lacks it. Held in memory on the server while it
/// is indexed, never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChunkText {
    /// Keyed chunk id (hex); the server checks it against the text. Empty: the server
    /// derives it from the text with the request's key (a server answering
    /// [`SYNC_VERSION_HEADER`] ≥ 2 takes that; the files' chunk lists still name each id).
    #[schemars(regex(pattern = "^([0-9a-fA-F]{64})?$"))]
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// Context lines (enclosing scopes' headers).
    pub context: Vec<String>,
    /// The chunk's text.
    pub text: String,
    /// Names the chunk defines (functions, types…), each found in its text; indexed as
    /// keyed terms of their own, so that search can prefer a definition to a use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub defines: Vec<String>,
}

/// Commits files and deletions. Every chunk of every file must be stored already or sent
/// here; a file's leaf is recorded only together with or after its chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CommitRequest {
    /// Files to add or replace.
    pub files: Vec<FileMeta>,
    /// Obfuscated paths (files or directories) to remove.
    #[schemars(inner(regex(pattern = OBFUSCATED_PATH)))]
    pub deletes: Vec<String>,
    /// Texts of the chunks the server lacked.
    pub chunks: Vec<ChunkText>,
}

/// What a commit did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CommitResponse {
    /// The new root hash (hex).
    pub root_hash: String,
    /// Files recorded.
    pub files: u64,
    /// Paths removed.
    pub deleted: u64,
    /// Chunks newly stored.
    pub chunks_stored: u64,
}

/// Chunks of current files that still lack a vector by the server's model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MissingVectors {
    /// The server's embedding model (`None`: the server cannot embed; search is lexical).
    pub model: Option<String>,
    /// Distinct chunks of current files.
    pub total: u64,
    /// How many lack a vector.
    pub missing_total: u64,
    /// Up to the asked limit of them, each with one obfuscated path of a file that holds it,
    /// in the order to embed them: source code first, then tests, then the rest.
    pub missing: Vec<MissingVector>,
    /// Each stage's chunks and how many lack a vector, in embedding order.
    #[serde(default)]
    pub stages: Vec<EmbedStage>,
}

/// One embedding stage's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EmbedStage {
    /// `code`, `tests` or `docs and other`.
    pub name: String,
    /// Distinct chunks in the stage.
    pub total: u64,
    /// Of which without a vector.
    pub missing: u64,
}

/// A chunk that lacks a vector, and where to find it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MissingVector {
    /// Keyed chunk id (hex).
    pub id: String,
    /// Obfuscated path of a file holding it.
    pub path: String,
    /// The server still holds the text it received at commit time: ask for it with
    /// [`EmbedRequest::held_next`] rather than send its text again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
}

/// Texts of stored chunks to embed. Held in memory while embedded, never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EmbedRequest {
    /// The chunks; each id is checked against its text.
    pub chunks: Vec<ChunkText>,
    /// Also embed up to this many of the chunks whose texts the server holds from their
    /// commit ([`MissingVector::held`]), in the listing's order, from memory: no text or id
    /// crosses the wire again. The request's key is checked against each held text as
    /// against a sent one. A server that holds none (restarted, another replica) embeds none
    /// of them: send those texts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub held_next: u32,
}

/// What an embed request did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EmbedResponse {
    /// Chunks run through the model.
    pub embedded: u64,
    /// Chunks skipped because they already had a vector.
    pub skipped: u64,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A search.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SearchRequest {
    /// The question or keywords, in plain text (held in memory only).
    pub query: String,
    /// Hits wanted (1-1000).
    #[schemars(range(min = 1, max = 1000))]
    pub k: u32,
    /// Which rankings take part.
    #[serde(default)]
    pub mode: SearchMode,
}

/// Which rankings a search uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SearchMode {
    /// BM25 and vectors, fused (the default).
    #[default]
    Hybrid,
    /// BM25 over keyed terms only.
    Lexical,
    /// Vectors only.
    Semantic,
}

/// Hits, best first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SearchResponse {
    /// The hits.
    pub hits: Vec<SearchHit>,
    /// Whether vectors took part (false: lexical only, no model or no vectors yet).
    pub semantic: bool,
    /// Distinct chunks of current files, and how many have vectors.
    pub embeddable: u64,
    /// How many of them have vectors.
    pub embedded: u64,
}

/// A chunk at a place in a file, by obfuscated path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SearchHit {
    /// Obfuscated path.
    pub path: String,
    /// First line, 1-based.
    pub start_line: u32,
    /// Last line, 1-based, inclusive.
    pub end_line: u32,
    /// Keyed chunk id (hex), for the client to check the file still holds it.
    pub id: String,
    /// The file's keyed leaf (hex) as indexed: when the client's file still has this leaf,
    /// the line range is exact without re-chunking.
    pub leaf: String,
    /// File kind.
    pub kind: String,
    /// Fused score, higher is better.
    pub score: f32,
    /// Rank in the lexical list (0 is best), if there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lexical_rank: Option<u32>,
    /// Rank in the vector list (0 is best), if there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector_rank: Option<u32>,
}
