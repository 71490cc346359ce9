//! The sync service: what the HTTP routes and the in-process transport both call, so embedded
//! and remote use share one code path.
//!
//! Chunk texts are held in memory only while their ids are checked and their keyed terms
//! computed; nothing here writes or logs them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use caret_crypto::ServerKey;
use caret_protocol::{
    ChunkMeta, CommitRequest, CommitResponse, CreateWorkspace, DirListing, FileMeta, PlanRequest, PlanResponse,
    TreeEntry, TreeRequest, TreeResponse, WorkspaceInfo,
};
use caret_store::{ChunkRecord, ChunkRef, FileRecord, Namespace, Record, State};
use caret_workspace::merkle::{MerkleTree, Node};
use caret_workspace::{ContentHash, RelPath};
use object_store::ObjectStore;
use tokio::sync::Mutex;

use crate::db::{Db, Tenant};
use crate::{Error, Result};

/// Largest number of files in one plan or commit.
pub const MAX_FILES: usize = 10_000;
/// Largest number of directories in one tree request.
pub const MAX_DIRS: usize = 20_000;
/// Largest chunk text.
pub const MAX_CHUNK_BYTES: usize = 1 << 20;

/// Loaded workspace states by (tenant id, workspace id), each behind its own lock.
type Loaded = HashMap<(String, String), Arc<Mutex<State>>>;

/// The service.
pub struct Service {
    db: Db,
    store: Arc<dyn ObjectStore>,
    loaded: std::sync::Mutex<Loaded>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("store", &self.store.to_string()).finish()
    }
}

fn is_valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn check_id(id: &str) -> Result<()> {
    if is_valid_id(id) {
        Ok(())
    } else {
        Err(Error::BadRequest("a workspace id is 1-64 characters of a-z and 0-9".into()))
    }
}

/// Obfuscated paths: `/`-separated segments of 1-64 characters of a-z and 0-9.
fn check_path(path: &str, allow_root: bool) -> Result<()> {
    if path.is_empty() && allow_root {
        return Ok(());
    }
    let ok = path.len() <= 8192 && path.split('/').all(is_valid_id);
    if ok {
        Ok(())
    } else {
        Err(Error::BadRequest("paths must be obfuscated: segments of a-z and 0-9 separated by /".into()))
    }
}

fn hex32(s: &str, what: &str) -> Result<[u8; 32]> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 {
        return Err(Error::BadRequest(format!("{what} must be 64 hex characters")));
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).map_err(|_| Error::BadRequest(format!("{what} is not hex")))?;
        out[i] = u8::from_str_radix(s, 16).map_err(|_| Error::BadRequest(format!("{what} is not hex")))?;
    }
    Ok(out)
}

fn file_record(f: &FileMeta) -> Result<FileRecord> {
    check_path(&f.path, false)?;
    let chunks = f
        .chunks
        .iter()
        .map(|c: &ChunkMeta| {
            if c.language.len() > 32 || c.kind.len() > 16 {
                return Err(Error::BadRequest("chunk language or kind is too long".into()));
            }
            Ok(ChunkRef {
                id: hex32(&c.id, "chunk id")?,
                start_line: c.start_line,
                end_line: c.end_line,
                language: c.language.clone(),
                kind: c.kind.clone(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(FileRecord { path: f.path.clone(), leaf: hex32(&f.leaf, "leaf")?, chunks })
}

impl Service {
    /// A service over a database and an object store.
    pub fn new(db: Db, store: Arc<dyn ObjectStore>) -> Self {
        Service { db, store, loaded: std::sync::Mutex::new(HashMap::new()) }
    }

    /// The metadata database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Whether the object store answers.
    pub async fn ping_store(&self) -> Result<()> {
        use futures::StreamExt as _;
        let mut list = self.store.list(Some(&object_store::path::Path::from("health")));
        if let Some(Err(e)) = list.next().await {
            return Err(Error::Store(e.into()));
        }
        Ok(())
    }

    fn namespace(&self, tenant: &Tenant, id: &str) -> Namespace {
        Namespace::new(self.store.clone(), &format!("t/{}/w/{id}", tenant.id))
    }

    /// The loaded state of a workspace that exists for this tenant, brought up to date.
    async fn state(&self, tenant: &Tenant, id: &str) -> Result<Arc<Mutex<State>>> {
        check_id(id)?;
        if self.db.workspace(tenant, id).await?.is_none() {
            return Err(Error::NotFound("workspace".into()));
        }
        let key = (tenant.id.clone(), id.to_owned());
        let existing = self.loaded.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
        let cell = match existing {
            Some(cell) => {
                let mut state = cell.lock().await;
                self.namespace(tenant, id).refresh(&mut state).await?;
                drop(state);
                cell
            }
            None => {
                let state = self.namespace(tenant, id).load().await?;
                let cell = Arc::new(Mutex::new(state));
                self.loaded.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(cell).clone()
            }
        };
        Ok(cell)
    }

    fn info(id: &str, key_id: &str, state: &mut State) -> WorkspaceInfo {
        WorkspaceInfo {
            id: id.to_owned(),
            key_id: key_id.to_owned(),
            root_hash: state.tree().root_hash().to_hex(),
            files: state.files.len() as u64,
            chunks: state.chunks.len() as u64,
        }
    }

    /// Creates a workspace, or returns the existing one if it has the same key.
    pub async fn create_workspace(&self, tenant: &Tenant, id: &str, req: &CreateWorkspace) -> Result<WorkspaceInfo> {
        check_id(id)?;
        if !is_valid_id(&req.key_id) {
            return Err(Error::BadRequest("key_id must be 1-64 characters of a-z and 0-9".into()));
        }
        let empty = MerkleTree::default().root_hash().to_hex();
        self.db.create_workspace(tenant, id, &req.key_id, &empty).await?;
        let info = self.workspace_info(tenant, id).await?;
        if info.key_id != req.key_id {
            return Err(Error::Conflict("this workspace was created with another key".into()));
        }
        Ok(info)
    }

    /// A workspace's current state.
    pub async fn workspace_info(&self, tenant: &Tenant, id: &str) -> Result<WorkspaceInfo> {
        let row = self.db.workspace(tenant, id).await?.ok_or_else(|| Error::NotFound("workspace".into()))?;
        let cell = self.state(tenant, id).await?;
        let mut state = cell.lock().await;
        Ok(Self::info(id, &row.key_id, &mut state))
    }

    /// A tenant's workspaces, as recorded after their last commits.
    pub async fn list_workspaces(&self, tenant: &Tenant) -> Result<Vec<WorkspaceInfo>> {
        Ok(self
            .db
            .workspaces(tenant)
            .await?
            .into_iter()
            .map(|w| WorkspaceInfo {
                id: w.id,
                key_id: w.key_id,
                root_hash: w.root_hash,
                files: u64::try_from(w.files).unwrap_or(0),
                chunks: u64::try_from(w.chunks).unwrap_or(0),
            })
            .collect())
    }

    /// Deletes a workspace and all its objects.
    pub async fn delete_workspace(&self, tenant: &Tenant, id: &str) -> Result<()> {
        check_id(id)?;
        if !self.db.delete_workspace(tenant, id).await? {
            return Err(Error::NotFound("workspace".into()));
        }
        self.loaded.lock().unwrap_or_else(|p| p.into_inner()).remove(&(tenant.id.clone(), id.to_owned()));
        self.namespace(tenant, id).destroy().await?;
        Ok(())
    }

    /// Listings of the asked directories.
    pub async fn tree(&self, tenant: &Tenant, id: &str, req: &TreeRequest) -> Result<TreeResponse> {
        if req.dirs.len() > MAX_DIRS {
            return Err(Error::BadRequest(format!("at most {MAX_DIRS} directories per request")));
        }
        for d in &req.dirs {
            check_path(d, true)?;
        }
        let cell = self.state(tenant, id).await?;
        let tree = cell.lock().await.tree();
        let root_hash = tree.root_hash().to_hex();
        if req.known_root.as_deref() == Some(root_hash.as_str()) {
            return Ok(TreeResponse { root_hash, dirs: Vec::new() });
        }
        let dirs = req
            .dirs
            .iter()
            .map(|path| match tree.get(&RelPath::from_bytes(path.as_bytes())) {
                Some(Node::Dir { children, .. }) => DirListing {
                    path: path.clone(),
                    exists: true,
                    entries: children
                        .iter()
                        .map(|(name, node)| TreeEntry {
                            name: String::from_utf8_lossy(name).into_owned(),
                            dir: matches!(node, Node::Dir { .. }),
                            hash: node.hash().to_hex(),
                        })
                        .collect(),
                },
                _ => DirListing { path: path.clone(), exists: false, entries: Vec::new() },
            })
            .collect();
        Ok(TreeResponse { root_hash, dirs })
    }

    /// The chunk ids of these files the server lacks.
    pub async fn plan(&self, tenant: &Tenant, id: &str, req: &PlanRequest) -> Result<PlanResponse> {
        if req.files.len() > MAX_FILES {
            return Err(Error::BadRequest(format!("at most {MAX_FILES} files per request")));
        }
        let records = req.files.iter().map(file_record).collect::<Result<Vec<_>>>()?;
        let cell = self.state(tenant, id).await?;
        let state = cell.lock().await;
        let mut seen = HashSet::new();
        let missing = records
            .iter()
            .flat_map(|f| f.chunks.iter())
            .filter(|c| !state.chunks.contains_key(&c.id) && seen.insert(c.id))
            .map(|c| ContentHash(c.id).to_hex())
            .collect();
        Ok(PlanResponse { missing })
    }

    /// Stores the sent chunks, then records the files and deletions, in one log object.
    pub async fn commit(
        &self,
        tenant: &Tenant,
        id: &str,
        key: &ServerKey,
        req: CommitRequest,
    ) -> Result<CommitResponse> {
        if req.files.len() > MAX_FILES || req.deletes.len() > MAX_FILES {
            return Err(Error::BadRequest(format!("at most {MAX_FILES} files and {MAX_FILES} deletions per request")));
        }
        let files = req.files.iter().map(file_record).collect::<Result<Vec<_>>>()?;
        for d in &req.deletes {
            check_path(d, false)?;
        }
        // Check every sent chunk against its id and compute its keyed terms, in memory.
        let ids = key.chunk_ids();
        let hasher = key.tokens();
        let mut chunk_records = Vec::with_capacity(req.chunks.len());
        for c in req.chunks {
            let claimed = hex32(&c.id, "chunk id")?;
            if c.text.len() > MAX_CHUNK_BYTES {
                return Err(Error::BadRequest(format!("a chunk is larger than {MAX_CHUNK_BYTES} bytes")));
            }
            if ids.id(&caret_crypto::chunk_content_hash(&c.context, &c.text)) != claimed {
                return Err(Error::BadRequest("a chunk's id does not match its text (wrong key?)".into()));
            }
            let mut text = c.context.join("\n");
            text.push('\n');
            text.push_str(&c.text);
            let (terms, length) = caret_store::lexical::hashed_terms(&text, |t| hasher.hash(t));
            chunk_records.push(ChunkRecord { id: claimed, length, terms });
        }

        let cell = self.state(tenant, id).await?;
        let mut state = cell.lock().await;
        let ns = self.namespace(tenant, id);
        ns.refresh(&mut state).await?;
        let sent: HashSet<[u8; 32]> = chunk_records.iter().map(|c| c.id).collect();
        let mut missing: Vec<String> = files
            .iter()
            .flat_map(|f| f.chunks.iter())
            .filter(|c| !state.chunks.contains_key(&c.id) && !sent.contains(&c.id))
            .map(|c| ContentHash(c.id).to_hex())
            .collect();
        if !missing.is_empty() {
            missing.sort();
            missing.dedup();
            return Err(Error::MissingChunks(missing));
        }
        let new_chunks = chunk_records.iter().filter(|c| !state.chunks.contains_key(&c.id)).count() as u64;
        let (n_files, n_deletes) = (files.len() as u64, req.deletes.len() as u64);
        let records: Vec<Record> = chunk_records
            .into_iter()
            .filter(|c| !state.chunks.contains_key(&c.id))
            .map(Record::Chunk)
            .chain(req.deletes.into_iter().map(Record::Delete))
            .chain(files.into_iter().map(Record::File))
            .collect();
        if !records.is_empty() {
            ns.append(&mut state, records).await?;
        }
        let root = state.tree().root_hash().to_hex();
        self.db.update_root(tenant, id, &root, state.files.len() as u64, state.chunks.len() as u64).await?;
        Ok(CommitResponse { root_hash: root, files: n_files, deleted: n_deletes, chunks_stored: new_chunks })
    }
}
