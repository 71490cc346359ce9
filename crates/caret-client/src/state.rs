//! The client's state for one workspace: its id, its key, and the reverse map from obfuscated
//! to real paths. All of it stays on the client.

use std::path::{Path, PathBuf};

use caret_crypto::WorkspaceKey;
use caret_workspace::RelPath;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A workspace on this machine.
#[derive(Debug)]
pub struct WorkspaceState {
    /// The canonical root.
    pub root: PathBuf,
    /// Where the client keeps this workspace's state (stat cache, path map).
    pub state_dir: PathBuf,
    /// The workspace id (random, shared with the server).
    pub id: String,
    /// Its key.
    pub key: WorkspaceKey,
    /// The key file.
    pub key_path: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct WorkspaceFile {
    id: String,
    root: String,
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { action, path, source }
}

/// Writes a client state file atomically.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    caret_workspace::statcache::write_atomic(path, bytes).map_err(io("writing", path))
}

impl WorkspaceState {
    /// Opens the workspace whose state lives in `state_dir`, creating its id and key on first
    /// use (the key under `keys_dir`, mode 0600).
    pub fn open(root: &Path, state_dir: &Path, keys_dir: &Path) -> Result<Self> {
        let root = std::fs::canonicalize(root).map_err(io("opening workspace", root))?;
        let file = state_dir.join("workspace.json");
        let id = match std::fs::read(&file) {
            Ok(bytes) => {
                let w: WorkspaceFile =
                    serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt(format!("{}: {e}", file.display())))?;
                w.id
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let id = caret_crypto::random_id()?;
                let w = WorkspaceFile { id: id.clone(), root: root.display().to_string() };
                let json = serde_json::to_vec_pretty(&w).map_err(|e| Error::Corrupt(e.to_string()))?;
                write_atomic(&file, &json)?;
                id
            }
            Err(e) => return Err(io("reading", &file)(e)),
        };
        let key_path = keys_dir.join(format!("{id}.key"));
        let key = if key_path.exists() {
            WorkspaceKey::load(&key_path)?
        } else {
            let key = WorkspaceKey::generate()?;
            key.save_new(&key_path)?;
            key
        };
        Ok(WorkspaceState { root, state_dir: state_dir.to_path_buf(), id, key, key_path })
    }

    /// A workspace whose id and key the caller holds (a server indexing documentation pages
    /// under a key it derives): nothing is read or written but the state directory's caches.
    pub fn given(root: &Path, state_dir: &Path, id: &str, key: WorkspaceKey) -> Result<Self> {
        let root = std::fs::canonicalize(root).map_err(io("opening workspace", root))?;
        std::fs::create_dir_all(state_dir).map_err(io("creating", state_dir))?;
        let key_path = state_dir.join("given.key");
        Ok(WorkspaceState { root, state_dir: state_dir.to_path_buf(), id: id.to_owned(), key, key_path })
    }

    /// Replaces the key (a team member's key, imported). The old one is kept as `.key.old`.
    pub fn replace_key(&mut self, key: WorkspaceKey) -> Result<()> {
        if self.key_path.exists() {
            let old = self.key_path.with_extension("key.old");
            let _ = std::fs::remove_file(&old);
            std::fs::rename(&self.key_path, &old).map_err(io("moving aside", &self.key_path))?;
        }
        key.save_new(&self.key_path)?;
        self.key = key;
        // Obfuscated names change with the key.
        let _ = std::fs::remove_file(self.path_map_file());
        Ok(())
    }

    /// The stat cache file of sync (hash depth; `caret scan` keeps its own).
    pub fn cache_file(&self) -> PathBuf {
        self.state_dir.join("sync-cache.bin")
    }

    fn path_map_file(&self) -> PathBuf {
        self.state_dir.join("paths.map")
    }

    /// Whether a sync from this state has completed before (its path map is saved).
    pub fn has_synced(&self) -> bool {
        self.path_map_file().exists()
    }

    /// Saves the reverse map (obfuscated → real path) of the last sync.
    pub fn save_path_map(&self, map: &[(String, RelPath)]) -> Result<()> {
        let mut out = Vec::with_capacity(map.len() * 96);
        for (obf, real) in map {
            for part in [obf.as_bytes(), real.as_bytes()] {
                out.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_le_bytes());
                out.extend_from_slice(part);
            }
        }
        write_atomic(&self.path_map_file(), &out)
    }

    /// Loads the reverse map; empty if there is none yet.
    pub fn load_path_map(&self) -> Result<Vec<(String, RelPath)>> {
        let path = self.path_map_file();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("reading", &path)(e)),
        };
        let corrupt = || Error::Corrupt(format!("{} is truncated", path.display()));
        let take = |rest: &mut &[u8]| -> Result<Vec<u8>> {
            let (len, tail) = rest.split_at_checked(4).ok_or_else(corrupt)?;
            let n = u32::from_le_bytes(len.try_into().map_err(|_| corrupt())?) as usize;
            let (part, tail) = tail.split_at_checked(n).ok_or_else(corrupt)?;
            *rest = tail;
            Ok(part.to_vec())
        };
        let mut rest = &bytes[..];
        let mut map = Vec::new();
        while !rest.is_empty() {
            let obf = String::from_utf8(take(&mut rest)?).map_err(|_| corrupt())?;
            map.push((obf, RelPath::from_bytes(take(&mut rest)?)));
        }
        Ok(map)
    }
}
