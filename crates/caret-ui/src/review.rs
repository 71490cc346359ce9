//! Checkpoints of the workspace before each agent turn, and the review of what the agent
//! changed: per-file accept (keep) and reject (restore), and rolling the workspace back to a
//! checkpoint.
//!
//! A checkpoint is every walked file's content hash (the indexer's walk: its ignore rules,
//! files up to 1 MiB), with the contents kept in memory once per distinct content; a file
//! whose size, mtime and inode match the previous checkpoint's (and whose mtime is more than
//! 2 s old) is not read again. What a turn changed is what differs between the checkpoint
//! before it and the workspace after it, together with the files its tools reported — so
//! changes made through the terminal count too. A changed file stays in the review, with its
//! content from before the first turn that changed it, until it is accepted or rejected (or
//! its content is that again).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use caret_workspace::walk::{WalkConfig, walk};

/// A file in a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    size: u64,
    mtime_ns: i64,
    ino: u64,
    hash: blake3::Hash,
}

/// The workspace before one turn.
#[derive(Debug, Clone)]
struct Checkpoint {
    id: u32,
    files: BTreeMap<String, Entry>,
    /// What the turn after it changed.
    changed: BTreeSet<String>,
}

/// Checkpoints kept (the oldest go first).
const KEEP: usize = 50;

/// A file in the review.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Changed {
    pub path: String,
    /// `add`, `update` or `delete`.
    pub kind: &'static str,
    /// Lines added and removed against the content before.
    pub added: usize,
    pub removed: usize,
}

/// The checkpoints and the review of one workspace.
pub struct Review {
    root: PathBuf,
    walk: WalkConfig,
    blobs: HashMap<blake3::Hash, Arc<Vec<u8>>>,
    checkpoints: Vec<Checkpoint>,
    /// Files in the review: path → content before the agent changed it (`None`: it did not
    /// exist).
    pending: BTreeMap<String, Option<blake3::Hash>>,
    next: u32,
}

impl Review {
    /// The review of the workspace at `root`.
    pub fn new(root: &Path) -> Review {
        Review {
            root: root.to_path_buf(),
            walk: WalkConfig::default(),
            blobs: HashMap::new(),
            checkpoints: Vec::new(),
            pending: BTreeMap::new(),
            next: 1,
        }
    }

    /// Reads the workspace as it is now, reusing the last checkpoint's hashes of files whose
    /// stat did not change.
    fn snapshot(&mut self) -> anyhow::Result<BTreeMap<String, Entry>> {
        let walked = walk(&self.root, &self.walk).with_context(|| format!("walking {}", self.root.display()))?;
        let now_ns = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as i64;
        let racy = Duration::from_secs(2).as_nanos() as i64;
        let previous = self.checkpoints.last().map(|c| &c.files);
        let mut files = BTreeMap::new();
        for f in walked.files {
            let Ok(rel) = std::str::from_utf8(f.path.as_bytes()).map(str::to_owned) else { continue };
            let (size, mtime_ns, ino) = (f.stat.size, f.stat.mtime_ns, f.stat.ino);
            if let Some(e) = previous.and_then(|p| p.get(&rel))
                && e.size == size
                && e.mtime_ns == mtime_ns
                && e.ino == ino
                && now_ns - mtime_ns > racy
            {
                files.insert(rel, *e);
                continue;
            }
            let Ok(bytes) = std::fs::read(self.root.join(&rel)) else { continue };
            let hash = blake3::hash(&bytes);
            self.blobs.entry(hash).or_insert_with(|| Arc::new(bytes));
            files.insert(rel, Entry { size, mtime_ns, ino, hash });
        }
        Ok(files)
    }

    /// Takes the checkpoint before a turn; returns its id.
    pub fn checkpoint(&mut self) -> anyhow::Result<u32> {
        let files = self.snapshot()?;
        let id = self.next;
        self.next += 1;
        self.checkpoints.push(Checkpoint { id, files, changed: BTreeSet::new() });
        if self.checkpoints.len() > KEEP {
            self.checkpoints.remove(0);
        }
        self.collect();
        Ok(id)
    }

    fn find(&self, id: u32) -> Option<&Checkpoint> {
        self.checkpoints.iter().find(|c| c.id == id)
    }

    /// A tool of turn `id` changed `path` (or the turn's end found it changed).
    pub fn note(&mut self, id: u32, path: &str) {
        let before = self.find(id).map(|c| c.files.get(path).map(|e| e.hash));
        let Some(before) = before else { return };
        if let Some(c) = self.checkpoints.iter_mut().find(|c| c.id == id) {
            c.changed.insert(path.to_owned());
        }
        self.pending.entry(path.to_owned()).or_insert(before);
    }

    /// After turn `id`: everything that differs from its checkpoint joins the review.
    pub fn after_turn(&mut self, id: u32) -> anyhow::Result<()> {
        let now = self.snapshot()?;
        let Some(before) = self.find(id).map(|c| c.files.clone()) else { return Ok(()) };
        let mut changed: Vec<String> = Vec::new();
        for (path, e) in &now {
            if before.get(path).map(|b| b.hash) != Some(e.hash) {
                changed.push(path.clone());
            }
        }
        changed.extend(before.keys().filter(|p| !now.contains_key(*p)).cloned());
        for path in changed {
            self.note(id, &path);
        }
        Ok(())
    }

    /// The current content's hash of `path` (`None`: absent or unreadable).
    fn current(&self, path: &str) -> Option<(blake3::Hash, Vec<u8>)> {
        let bytes = std::fs::read(self.root.join(path)).ok()?;
        Some((blake3::hash(&bytes), bytes))
    }

    /// The files in the review, dropping those whose content is what it was before.
    pub fn list(&mut self) -> Vec<Changed> {
        let mut out = Vec::new();
        let mut same = Vec::new();
        for (path, before) in &self.pending {
            let now = self.current(path);
            if now.as_ref().map(|(h, _)| *h) == *before {
                same.push(path.clone());
                continue;
            }
            let old = before.and_then(|h| self.blobs.get(&h)).map(|b| String::from_utf8_lossy(b).into_owned());
            let new = now.as_ref().map(|(_, b)| String::from_utf8_lossy(b).into_owned());
            let (added, removed) = line_counts(old.as_deref().unwrap_or(""), new.as_deref().unwrap_or(""));
            let kind = match (before, &now) {
                (None, _) => "add",
                (Some(_), None) => "delete",
                _ => "update",
            };
            out.push(Changed { path: path.clone(), kind, added, removed });
        }
        for p in same {
            self.pending.remove(&p);
        }
        out
    }

    /// The content before and now of a file in the review (`None`: absent).
    pub fn diff(&self, path: &str) -> anyhow::Result<(Option<String>, Option<String>)> {
        let before = self.pending.get(path).with_context(|| format!("{path} is not in the review"))?;
        let old = before.and_then(|h| self.blobs.get(&h)).map(|b| String::from_utf8_lossy(b).into_owned());
        let new = self.current(path).map(|(_, b)| String::from_utf8_lossy(&b).into_owned());
        Ok((old, new))
    }

    /// Keeps the agent's change to `path`.
    pub fn accept(&mut self, path: &str) -> anyhow::Result<()> {
        self.pending.remove(path).with_context(|| format!("{path} is not in the review"))?;
        Ok(())
    }

    /// Undoes the agent's change to `path`: its content before, or no file when it was new.
    pub fn reject(&mut self, path: &str) -> anyhow::Result<()> {
        let before = *self.pending.get(path).with_context(|| format!("{path} is not in the review"))?;
        self.put(path, before)?;
        self.pending.remove(path);
        Ok(())
    }

    /// Rolls every file changed since checkpoint `id` back to it; returns their paths.
    pub fn restore(&mut self, id: u32) -> anyhow::Result<Vec<String>> {
        let at = self
            .checkpoints
            .iter()
            .position(|c| c.id == id)
            .with_context(|| format!("there is no checkpoint {id} (the last {KEEP} are kept)"))?;
        let paths: BTreeSet<String> = self.checkpoints[at..].iter().flat_map(|c| c.changed.iter().cloned()).collect();
        let target = self.checkpoints[at].files.clone();
        for path in &paths {
            self.put(path, target.get(path).map(|e| e.hash))?;
        }
        self.checkpoints.truncate(at + 1);
        self.checkpoints[at].changed.clear();
        self.list();
        Ok(paths.into_iter().collect())
    }

    /// Writes `path` with the content `hash` names (atomically), or removes it (`None`).
    fn put(&self, path: &str, hash: Option<blake3::Hash>) -> anyhow::Result<()> {
        let abs = self.root.join(path);
        match hash {
            Some(h) => {
                let bytes = self.blobs.get(&h).with_context(|| format!("the content of {path} was not kept"))?;
                caret_workspace::statcache::write_atomic(&abs, bytes).with_context(|| format!("writing {path}"))
            }
            None => match std::fs::remove_file(&abs) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("removing {}", abs.display()))
                }
                _ => Ok(()),
            },
        }
    }

    /// Drops contents no checkpoint or review entry names.
    fn collect(&mut self) {
        let mut live: std::collections::HashSet<blake3::Hash> = self.pending.values().flatten().copied().collect();
        for c in &self.checkpoints {
            live.extend(c.files.values().map(|e| e.hash));
        }
        self.blobs.retain(|h, _| live.contains(h));
    }
}

/// Lines added and removed from `old` to `new`.
pub fn line_counts(old: &str, new: &str) -> (usize, usize) {
    let diff = similar::TextDiff::from_lines(old, new);
    let (mut added, mut removed) = (0, 0);
    for change in diff.iter_all_changes() {
        match change.tag() {
            similar::ChangeTag::Insert => added += 1,
            similar::ChangeTag::Delete => removed += 1,
            similar::ChangeTag::Equal => {}
        }
    }
    (added, removed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn changes_are_reviewed_per_file_and_checkpoints_roll_back() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a.py"), "a = 1\n").unwrap();
        std::fs::write(root.join("b.py"), "b = 1\n").unwrap();
        let mut r = Review::new(root);

        // Turn 1: a tool edits a.py, the terminal creates c.py and deletes b.py.
        let t1 = r.checkpoint().unwrap();
        std::fs::write(root.join("a.py"), "a = 2\nx = 0\n").unwrap();
        r.note(t1, "a.py");
        std::fs::write(root.join("c.py"), "c = 1\n").unwrap();
        std::fs::remove_file(root.join("b.py")).unwrap();
        r.after_turn(t1).unwrap();
        let list = r.list();
        let kinds: Vec<(&str, &str, usize, usize)> =
            list.iter().map(|c| (c.path.as_str(), c.kind, c.added, c.removed)).collect();
        assert_eq!(kinds, [("a.py", "update", 2, 1), ("b.py", "delete", 0, 1), ("c.py", "add", 1, 0)]);
        assert_eq!(r.diff("a.py").unwrap(), (Some("a = 1\n".into()), Some("a = 2\nx = 0\n".into())));

        // Reject restores, accept keeps.
        r.reject("b.py").unwrap();
        assert_eq!(std::fs::read_to_string(root.join("b.py")).unwrap(), "b = 1\n");
        r.reject("c.py").unwrap();
        assert!(!root.join("c.py").exists());
        r.accept("a.py").unwrap();
        assert!(r.list().is_empty());
        assert_eq!(std::fs::read_to_string(root.join("a.py")).unwrap(), "a = 2\nx = 0\n");
        assert!(r.reject("a.py").is_err(), "no longer in the review");

        // Turns 2 and 3, then back to before turn 2: both turns' changes undone, a file the
        // user changed that no turn touched is left alone.
        let t2 = r.checkpoint().unwrap();
        std::fs::write(root.join("a.py"), "a = 3\n").unwrap();
        r.after_turn(t2).unwrap();
        let t3 = r.checkpoint().unwrap();
        std::fs::write(root.join("d.py"), "d\n").unwrap();
        r.after_turn(t3).unwrap();
        std::fs::write(root.join("b.py"), "b = user\n").unwrap();
        let restored = r.restore(t2).unwrap();
        assert_eq!(restored, ["a.py", "d.py"]);
        assert_eq!(std::fs::read_to_string(root.join("a.py")).unwrap(), "a = 2\nx = 0\n");
        assert!(!root.join("d.py").exists());
        assert_eq!(std::fs::read_to_string(root.join("b.py")).unwrap(), "b = user\n");
        assert!(r.list().is_empty(), "the review empties when the files are as before");
        assert!(r.restore(t3).is_err(), "later checkpoints are gone");
    }

    #[test]
    fn a_file_changed_back_by_hand_leaves_the_review() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "one\n").unwrap();
        let mut r = Review::new(dir.path());
        let t = r.checkpoint().unwrap();
        std::fs::write(dir.path().join("a.txt"), "two\n").unwrap();
        r.after_turn(t).unwrap();
        assert_eq!(r.list().len(), 1);
        std::fs::write(dir.path().join("a.txt"), "one\n").unwrap();
        assert!(r.list().is_empty());
    }
}
