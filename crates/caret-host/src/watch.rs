//! The daemon's file watchers: whether anything changed under a workspace since a command last
//! looked, so `caret scan` and `caret sync` can answer without walking it.
//!
//! A command asks the running daemon (`POST /v1/local/watch`, the root) before it scans. The
//! daemon watches the root from the first ask on (inotify, recursively) and answers with the
//! watcher's id and how many changes it has seen. The command scans and keeps what it found
//! with that id and count ([`save`]); a later command that gets the same id and the same count
//! knows nothing under the root changed since that scan began, and answers from the record
//! ([`load`]) instead of walking (`crate::daemon::ask_watcher` asks; `crate::unchanged` keeps
//! what the commands record). Nothing starts a daemon for this: without one, or with one of
//! another build, commands scan as they always did.
//!
//! What counts as a change: any event but a read, under the root — except inside `.git/`
//! and inside directories the last scan skipped by an ignore rule (the caller names them), so
//! a build writing `target/` or git rewriting its index does not make every scan walk. A lost
//! event (the kernel's queue overflowed, a watch could not be added) counts as a change. What
//! the watcher cannot see — ignore files above the root, `.git/info/exclude`, the global
//! excludes — goes into the record's stamp ([`stamp`]) by their `stat`, as do the scan's
//! settings.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use notify::Watcher as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The daemon's route.
pub const ROUTE: &str = "/v1/local/watch";

/// Roots watched at once; asking for another drops the one asked about longest ago.
const MAX_ROOTS: usize = 32;
/// Ignored directories kept per root; beyond, events in them count (a correct, slower answer).
const MAX_IGNORED: usize = 50_000;

/// What a command asks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatchRequest {
    /// The workspace root, absolute.
    pub root: PathBuf,
    /// Directories (relative to the root) the command's last walk skipped by an ignore rule:
    /// events inside them do not count from now on. Empty keeps the ones given before.
    #[serde(default)]
    pub ignored: Vec<String>,
}

/// The daemon's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchReply {
    /// This watcher (a new one after a daemon restarts, or after the root was dropped).
    pub watch: String,
    /// Changes it has seen under the root.
    pub changes: u64,
}

/// After an event that may have brought a directory (a creation, a rename), how long the
/// watcher may still be adding watches below it: the watcher hears of the directory before it
/// watches inside it, so a count read meanwhile may not cover changes in there yet.
const SETTLING: std::time::Duration = std::time::Duration::from_secs(2);

/// How long an answer waits for the watcher to catch up with the kernel's queue; beyond, the
/// count is moved on (a full scan, never a stale answer).
const BARRIER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// One watched root, as the watcher's thread sees it.
struct Shared {
    root: PathBuf,
    id: String,
    changes: AtomicU64,
    ignored: RwLock<HashSet<PathBuf>>,
    born: Instant,
    /// Milliseconds after `born` of the last event that may have brought a directory (+1; 0:
    /// none yet).
    structure_ms: AtomicU64,
    /// A private directory watched by the same watcher: a file written there is a barrier,
    /// its event arriving after every event the kernel queued before it.
    barrier_dir: PathBuf,
    barrier_next: AtomicU64,
    barrier_seen: (Mutex<u64>, std::sync::Condvar),
}

impl Shared {
    fn new(root: PathBuf, id: String, barrier_dir: PathBuf) -> Shared {
        Shared {
            root,
            id,
            changes: AtomicU64::new(0),
            ignored: RwLock::new(HashSet::new()),
            born: Instant::now(),
            structure_ms: AtomicU64::new(0),
            barrier_dir,
            barrier_next: AtomicU64::new(1),
            barrier_seen: (Mutex::new(0), std::sync::Condvar::new()),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Waits until the watcher has handled every event queued before now: a change made just
    /// before the ask is counted in its answer.
    fn catch_up(&self) -> bool {
        let n = self.barrier_next.fetch_add(1, Ordering::AcqRel);
        let file = self.barrier_dir.join(n.to_string());
        if std::fs::write(&file, b"").is_err() {
            return false;
        }
        let (seen, cond) = &self.barrier_seen;
        let guard = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (guard, timeout) = cond
            .wait_timeout_while(guard, BARRIER_WAIT, |seen| *seen < n)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        drop(guard);
        let _ = std::fs::remove_file(&file);
        !timeout.timed_out()
    }

    /// The watcher and its count, once caught up with the kernel. While watches may still
    /// be being added below a new directory, or when it could not catch up, the count is
    /// moved on after reading it, so nothing recorded under it now is trusted later.
    fn reply(&self) -> WatchReply {
        let caught_up = self.catch_up();
        self.answer(caught_up)
    }

    fn answer(&self, caught_up: bool) -> WatchReply {
        let changes = self.changes.load(Ordering::Acquire);
        let last = self.structure_ms.load(Ordering::Acquire);
        let settling = last > 0 && self.now_ms().saturating_sub(last - 1) < SETTLING.as_millis() as u64;
        if settling || !caught_up {
            self.changes.fetch_add(1, Ordering::AcqRel);
        }
        WatchReply { watch: self.id.clone(), changes }
    }

    fn observe(&self, event: notify::Result<notify::Event>) {
        if let Ok(e) = &event
            && let Some(n) = e.paths.iter().find_map(|p| self.barrier(p))
        {
            if matches!(e.kind, notify::EventKind::Create(_)) {
                let (seen, cond) = &self.barrier_seen;
                let mut seen = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                *seen = (*seen).max(n);
                cond.notify_all();
            }
            return;
        }
        let counts = match &event {
            Err(_) => true,
            Ok(e) if e.kind.is_access() => false,
            Ok(e) if e.need_rescan() || e.paths.is_empty() => true,
            Ok(e) => e.paths.iter().any(|p| self.counts(p)),
        };
        if counts {
            if let Ok(e) = &event
                && brings_a_directory(e)
            {
                self.structure_ms.store(self.now_ms() + 1, Ordering::Release);
            }
            self.changes.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The barrier number of an event in the barrier directory.
    fn barrier(&self, path: &Path) -> Option<u64> {
        let name = path.strip_prefix(&self.barrier_dir).ok()?;
        name.to_str()?.parse().ok()
    }

    /// Whether an event at `path` may change what a scan finds.
    fn counts(&self, path: &Path) -> bool {
        let Ok(rel) = path.strip_prefix(&self.root) else { return true };
        let parts: Vec<Component<'_>> = rel.components().collect();
        if parts.len() > 1 && parts[0].as_os_str() == ".git" {
            return false;
        }
        let ignored = self.ignored.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if ignored.is_empty() {
            return true;
        }
        // Strictly inside an ignored directory; the directory itself (removed, renamed, its
        // mode changed) still counts.
        let mut at = PathBuf::new();
        for part in &parts[..parts.len().saturating_sub(1)] {
            at.push(part);
            if ignored.contains(&at) {
                return false;
            }
        }
        true
    }
}

/// Whether an event may have brought a directory the watcher must now watch inside: one
/// created, or a rename whose end is a directory (a file saved by renaming is not).
fn brings_a_directory(e: &notify::Event) -> bool {
    use notify::event::{CreateKind, ModifyKind};
    match e.kind {
        notify::EventKind::Create(CreateKind::File) => false,
        notify::EventKind::Create(_) => true,
        notify::EventKind::Modify(ModifyKind::Name(_)) => {
            e.paths.iter().any(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        }
        _ => false,
    }
}

struct Entry {
    shared: Arc<Shared>,
    asked: Instant,
    _watcher: notify::RecommendedWatcher,
}

impl Drop for Entry {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.shared.barrier_dir);
    }
}

/// The daemon's watched roots.
pub struct Watches {
    roots: Mutex<HashMap<PathBuf, Entry>>,
    /// Where each watch's barrier directory goes (emptied at start: the daemon's own).
    barriers: PathBuf,
}

impl Watches {
    /// Watches keeping their barrier directories under `barriers`.
    pub fn new(barriers: PathBuf) -> Watches {
        let _ = std::fs::remove_dir_all(&barriers);
        Watches { roots: Mutex::new(HashMap::new()), barriers }
    }

    /// Answers for `req.root`, watching it from now on if it was not (blocking: adding the
    /// watches walks the tree once, and an answer waits for the watcher to catch up).
    pub fn ask(&self, req: &WatchRequest) -> Result<WatchReply, String> {
        if !req.root.is_absolute() {
            return Err(format!("{}: the root must be an absolute path", req.root.display()));
        }
        let root = std::fs::canonicalize(&req.root).map_err(|e| format!("{}: {e}", req.root.display()))?;
        if !root.is_dir() {
            return Err(format!("{}: not a directory", root.display()));
        }
        let mut roots = self.roots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = roots.get_mut(&root) {
            entry.asked = Instant::now();
            set_ignored(&entry.shared, &req.ignored);
            return Ok(entry.shared.reply());
        }
        let id = caret_crypto::random_id().map_err(|e| e.to_string())?;
        let barrier_dir = self.barriers.join(&id);
        std::fs::create_dir_all(&barrier_dir).map_err(|e| format!("{}: {e}", barrier_dir.display()))?;
        let shared = Arc::new(Shared::new(root.clone(), id, barrier_dir.clone()));
        set_ignored(&shared, &req.ignored);
        let seen = shared.clone();
        let mut watcher = notify::RecommendedWatcher::new(
            move |event| seen.observe(event),
            notify::Config::default().with_follow_symlinks(false),
        )
        .map_err(|e| format!("starting a file watcher: {e}"))?;
        let watched = watcher
            .watch(&barrier_dir, notify::RecursiveMode::NonRecursive)
            .and_then(|()| watcher.watch(&root, notify::RecursiveMode::Recursive));
        if let Err(e) = watched {
            let _ = std::fs::remove_dir_all(&barrier_dir);
            return Err(format!("watching {}: {e} (see fs.inotify.max_user_watches)", root.display()));
        }
        if roots.len() >= MAX_ROOTS
            && let Some(oldest) = roots.iter().min_by_key(|(_, e)| e.asked).map(|(p, _)| p.clone())
        {
            roots.remove(&oldest);
        }
        let reply = shared.reply();
        roots.insert(root, Entry { shared, asked: Instant::now(), _watcher: watcher });
        Ok(reply)
    }
}

fn set_ignored(shared: &Shared, dirs: &[String]) {
    if dirs.is_empty() {
        return;
    }
    let set: HashSet<PathBuf> =
        if dirs.len() > MAX_IGNORED { HashSet::new() } else { dirs.iter().map(PathBuf::from).collect() };
    *shared.ignored.write().unwrap_or_else(std::sync::PoisonError::into_inner) = set;
}

/// The settings that decide what a scan finds, for [`stamp`]: the scan and chunk sections
/// and the tokenizer file's `stat` (the embedding model's files are in the daemon's identity:
/// a daemon serving other ones is not asked). `what` names the command keeping the record.
pub fn settings(config: &crate::config::Config, what: &str) -> String {
    use std::os::unix::fs::MetadataExt as _;
    let tokenizer = config
        .chunk
        .tokenizer
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| format!("{} {} {} {}", m.len(), m.mtime(), m.mtime_nsec(), m.ino()));
    format!("{what}|{:?}|{:?}|{tokenizer:?}", config.scan, config.chunk)
}

/// What a record is only valid with: the command's settings (`settings`, e.g. the scanner's
/// fingerprint) and the `stat` of each file outside the watcher's sight that decides the walk.
pub fn stamp(settings: &str, root: &Path, walk: &caret_workspace::walk::WalkConfig) -> String {
    use std::os::unix::fs::MetadataExt as _;
    let mut text = format!("{settings}\n{walk:?}\n");
    for file in caret_workspace::walk::rule_files(root, walk) {
        match std::fs::metadata(&file) {
            Ok(m) => {
                text.push_str(&format!("{} {} {} {} {}\n", file.display(), m.len(), m.mtime(), m.mtime_nsec(), m.ino()))
            }
            Err(_) => text.push_str(&format!("{} absent\n", file.display())),
        }
    }
    caret_workspace::ContentHash::of(text.as_bytes()).to_hex()
}

#[derive(Serialize, Deserialize)]
struct Record<T> {
    watch: WatchReply,
    stamp: String,
    value: T,
}

/// The value kept at `path` if it was recorded under this very watcher and count of changes
/// and with the same stamp; `None` otherwise (or when unreadable: the caller scans).
pub fn load<T: DeserializeOwned>(path: &Path, now: &WatchReply, stamp: &str) -> Option<T> {
    let record: Record<T> = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    (record.watch == *now && record.stamp == stamp).then_some(record.value)
}

/// Keeps `value` as what a scan that began at `at` found (written whole: a temporary file,
/// then a rename).
pub fn save<T: Serialize>(path: &Path, at: &WatchReply, stamp: &str, value: &T) -> std::io::Result<()> {
    let record = Record { watch: at.clone(), stamp: stamp.to_owned(), value };
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec(&record).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, path)
}

/// Forgets a record (a scan or sync that could not finish leaves none behind).
pub fn forget(path: &Path) {
    let _ = std::fs::remove_file(path);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(root: &Path, ignored: &[&str]) -> Shared {
        let s = Shared::new(root.to_path_buf(), "w".into(), PathBuf::from("/nonexistent/barriers"));
        *s.ignored.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            ignored.iter().map(PathBuf::from).collect();
        s
    }

    #[test]
    fn events_in_git_and_ignored_directories_do_not_count() {
        let s = shared(Path::new("/ws"), &["target", "web/node_modules"]);
        assert!(s.counts(Path::new("/ws/src/main.rs")));
        assert!(s.counts(Path::new("/ws/.gitignore")));
        assert!(!s.counts(Path::new("/ws/.git/index")));
        assert!(s.counts(Path::new("/ws/.git")), "the .git entry itself counts");
        assert!(!s.counts(Path::new("/ws/target/debug/caret")));
        assert!(s.counts(Path::new("/ws/target")), "an ignored directory itself counts");
        assert!(!s.counts(Path::new("/ws/web/node_modules/x/index.js")));
        assert!(s.counts(Path::new("/ws/web/src/index.js")));
        assert!(s.counts(Path::new("/ws/targets/a.rs")), "a name that merely starts alike counts");
        assert!(s.counts(Path::new("/elsewhere/a.rs")), "outside the root counts");
    }

    #[test]
    fn reads_do_not_count_and_lost_events_do() {
        let s = shared(Path::new("/ws"), &[]);
        let event = |kind| Ok(notify::Event::new(kind).add_path(PathBuf::from("/ws/a.rs")));
        s.observe(event(notify::EventKind::Access(notify::event::AccessKind::Any)));
        assert_eq!(s.changes.load(Ordering::Acquire), 0);
        s.observe(event(notify::EventKind::Modify(notify::event::ModifyKind::Any)));
        assert_eq!(s.changes.load(Ordering::Acquire), 1);
        s.observe(Ok(notify::Event::new(notify::EventKind::Other).set_flag(notify::event::Flag::Rescan)));
        assert_eq!(s.changes.load(Ordering::Acquire), 2);
        s.observe(Err(notify::Error::generic("queue overflow")));
        assert_eq!(s.changes.load(Ordering::Acquire), 3);
    }

    #[test]
    fn a_count_read_while_a_new_directory_settles_or_behind_the_kernel_is_not_trusted_later() {
        let s = shared(Path::new("/ws"), &[]);
        let steady = s.answer(true);
        assert_eq!(s.answer(true), steady, "nothing happened: the same count");
        let behind = s.answer(false);
        assert_eq!(behind, steady, "the count as read");
        assert_ne!(s.answer(true), behind, "read behind the kernel: the next answer differs");
        let steady = s.answer(true);
        let file = notify::EventKind::Create(notify::event::CreateKind::File);
        s.observe(Ok(notify::Event::new(file).add_path(PathBuf::from("/ws/new.rs"))));
        let after_file = s.answer(true);
        assert_ne!(after_file, steady, "a new file is a change");
        assert_eq!(s.answer(true), after_file, "but no new directory to settle");
        let steady = after_file;
        let created = notify::EventKind::Create(notify::event::CreateKind::Folder);
        s.observe(Ok(notify::Event::new(created).add_path(PathBuf::from("/ws/new"))));
        let during = s.answer(true);
        assert_ne!(during.changes, steady.changes);
        assert_ne!(s.answer(true), during, "read while settling: the next answer differs");
    }

    /// Through a real watcher: each answer covers every change made before the ask (no
    /// waiting), reads and writes inside an ignored directory do not count.
    #[test]
    fn a_watched_root_counts_a_write_made_just_before_the_ask() -> Result<(), String> {
        let io = |e: std::io::Error| e.to_string();
        let dir = tempfile::tempdir().map_err(io)?;
        std::fs::create_dir(dir.path().join("target")).map_err(io)?;
        std::fs::write(dir.path().join("a.rs"), "fn a() {}").map_err(io)?;
        let barriers = tempfile::tempdir().map_err(io)?;
        let watches = Watches::new(barriers.path().join("b"));
        let root = dir.path().to_path_buf();
        let ask = |ignored: Vec<String>| watches.ask(&WatchRequest { root: root.clone(), ignored });
        let first = ask(vec!["target".into()])?;
        assert_eq!(ask(vec![])?, first, "nothing changed");
        std::fs::read(dir.path().join("a.rs")).map_err(io)?;
        std::fs::write(dir.path().join("target").join("out.o"), "x").map_err(io)?;
        assert_eq!(ask(vec![])?, first, "a read and a write inside an ignored directory do not count");
        let mut quiet = first;
        for round in 0..20 {
            std::fs::write(dir.path().join("a.rs"), format!("fn a() {{ {round} }}")).map_err(io)?;
            let now = ask(vec![])?;
            assert_eq!(now.watch, quiet.watch);
            assert!(now.changes > quiet.changes, "round {round}: the write just before the ask is counted");
            quiet = ask(vec![])?;
            assert_eq!(ask(vec![])?, quiet, "round {round}: quiet again");
        }
        Ok(())
    }

    #[test]
    fn a_record_is_used_only_under_the_same_watcher_count_and_stamp() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("record.json");
        let at = WatchReply { watch: "w1".into(), changes: 4 };
        assert_eq!(load::<u32>(&path, &at, "s"), None);
        save(&path, &at, "s", &7u32)?;
        assert_eq!(load::<u32>(&path, &at, "s"), Some(7));
        assert_eq!(load::<u32>(&path, &WatchReply { changes: 5, ..at.clone() }, "s"), None);
        assert_eq!(load::<u32>(&path, &WatchReply { watch: "w2".into(), ..at.clone() }, "s"), None);
        assert_eq!(load::<u32>(&path, &at, "other settings"), None);
        std::fs::write(&path, "{not json")?;
        assert_eq!(load::<u32>(&path, &at, "s"), None, "a corrupt record is no record");
        Ok(())
    }
}
