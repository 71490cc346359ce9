//! The workspace's files for the page: the tree (the walk's ignore rules), reading,
//! saving atomically with a check that the file did not change on disk meanwhile, and
//! watching for changes made by anything else.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use notify::Watcher as _;
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// Files the tree lists at most.
pub const TREE_LIMIT: usize = 100_000;
/// Largest file the page opens.
pub const OPEN_LIMIT: u64 = 16 << 20;

/// Why a file cannot be read or written.
#[derive(Debug)]
pub enum FileError {
    /// Not a path inside the workspace.
    Outside(String),
    NotFound(String),
    TooLarge {
        path: String,
        bytes: u64,
    },
    Binary(String),
    /// Changed on disk since the version the page had.
    Conflict {
        version: String,
        text: String,
    },
    Io(anyhow::Error),
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileError::Outside(p) => write!(f, "{p:?} is not a path inside the workspace"),
            FileError::NotFound(p) => write!(f, "{p} does not exist"),
            FileError::TooLarge { path, bytes } => {
                write!(f, "{path} is {bytes} bytes; the editor opens files up to {} MiB", OPEN_LIMIT >> 20)
            }
            FileError::Binary(p) => write!(f, "{p} is not UTF-8 text (binary?): not opened"),
            FileError::Conflict { .. } => write!(f, "the file changed on disk since it was opened"),
            FileError::Io(e) => write!(f, "{e:#}"),
        }
    }
}

/// The version of a file's content (what a save names as its base).
pub fn version(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex()[..20].to_owned()
}

/// The absolute path of workspace-relative `rel`: no absolute paths, no `..`, and nothing
/// that resolves (through links) outside the root.
pub fn resolve(root: &Path, rel: &str) -> Result<PathBuf, FileError> {
    let p = Path::new(rel);
    if rel.is_empty() || rel.contains('\0') || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(FileError::Outside(rel.to_owned()));
    }
    let abs = root.join(p);
    // The deepest existing ancestor must stay under the root once links are resolved.
    let mut probe = abs.as_path();
    loop {
        if let Ok(real) = probe.canonicalize() {
            if !real.starts_with(root) {
                return Err(FileError::Outside(rel.to_owned()));
            }
            break;
        }
        match probe.parent() {
            Some(parent) => probe = parent,
            None => break,
        }
    }
    Ok(abs)
}

/// Paths of the workspace's files (sorted), as the indexer walks them but with no size limit
/// and without its default excludes (lock files and generated code are files a person opens).
pub fn tree(root: &Path) -> anyhow::Result<(Vec<String>, bool)> {
    let mut files = listed(root)?;
    let truncated = files.len() > TREE_LIMIT;
    files.truncate(TREE_LIMIT);
    Ok((files, truncated))
}

/// Every file the tree would list (the ignore rules; any size), sorted.
fn listed(root: &Path) -> anyhow::Result<Vec<String>> {
    let config = caret_workspace::walk::WalkConfig {
        max_file_size: u64::MAX,
        default_excludes: false,
        ..caret_workspace::walk::WalkConfig::default()
    };
    let out = caret_workspace::walk::walk(root, &config).with_context(|| format!("walking {}", root.display()))?;
    Ok(out.files.into_iter().filter_map(|f| std::str::from_utf8(f.path.as_bytes()).ok().map(str::to_owned)).collect())
}

/// A file's text and version.
pub fn read(root: &Path, rel: &str) -> Result<(String, String), FileError> {
    let abs = resolve(root, rel)?;
    let meta = std::fs::metadata(&abs).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => FileError::NotFound(rel.to_owned()),
        _ => FileError::Io(anyhow::Error::new(e).context(format!("reading {rel}"))),
    })?;
    if !meta.is_file() {
        return Err(FileError::NotFound(rel.to_owned()));
    }
    if meta.len() > OPEN_LIMIT {
        return Err(FileError::TooLarge { path: rel.to_owned(), bytes: meta.len() });
    }
    let bytes =
        std::fs::read(&abs).map_err(|e| FileError::Io(anyhow::Error::new(e).context(format!("reading {rel}"))))?;
    let v = version(&bytes);
    if bytes.contains(&0) {
        return Err(FileError::Binary(rel.to_owned()));
    }
    let text = String::from_utf8(bytes).map_err(|_| FileError::Binary(rel.to_owned()))?;
    Ok((text, v))
}

/// Saves `text` to `rel` unless the file on disk is no longer version `base` (`None`: write
/// whatever is there — a new file, or the user chose to overwrite). Returns the new version.
pub fn save(root: &Path, rel: &str, text: &str, base: Option<&str>) -> Result<String, FileError> {
    let abs = resolve(root, rel)?;
    if let Some(base) = base {
        match std::fs::read(&abs) {
            Ok(bytes) if version(&bytes) != base => {
                return Err(FileError::Conflict {
                    version: version(&bytes),
                    text: String::from_utf8_lossy(&bytes).into_owned(),
                });
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(FileError::Conflict { version: String::new(), text: String::new() });
            }
            Err(e) => return Err(FileError::Io(anyhow::Error::new(e).context(format!("reading {rel}")))),
        }
    }
    // Through a temporary file renamed over it, the mode kept: a reader sees the old content
    // or the new, never half.
    caret_workspace::statcache::write_atomic(&abs, text.as_bytes())
        .map_err(|e| FileError::Io(anyhow::Error::new(e).context(format!("writing {rel}"))))?;
    Ok(version(text.as_bytes()))
}

/// Watches the workspace, sending `{"type": "changed", "path"}` for each file of the tree
/// changed on disk and `{"type": "tree"}` (at most once a second) when the files the tree
/// lists come or go; ignored files (build output) send nothing. The watcher lives as long
/// as the returned value.
pub fn watch(root: &Path, tx: broadcast::Sender<Value>) -> anyhow::Result<notify::RecommendedWatcher> {
    let root_owned = root.to_path_buf();
    // The files the tree lists: changes to anything else (build output, ignored directories)
    // are not the page's business, and would flood it during a build.
    let known_files: Arc<RwLock<HashSet<String>>> = Arc::new(RwLock::new(listed(root)?.into_iter().collect()));
    let (tree_tx, mut tree_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let changes = tx.clone();
    let known = known_files.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        use notify::EventKind;
        let structural = matches!(
            event.kind,
            EventKind::Create(_) | EventKind::Remove(_) | EventKind::Modify(notify::event::ModifyKind::Name(_))
        );
        if !matches!(event.kind, EventKind::Create(_) | EventKind::Remove(_) | EventKind::Modify(_)) {
            return;
        }
        let mut inside = false;
        for path in &event.paths {
            let Ok(rel) = path.strip_prefix(&root_owned) else { continue };
            let rel = rel.to_string_lossy().replace('\\', "/");
            if rel.is_empty() || rel.split('/').any(|c| c == ".git") {
                continue;
            }
            inside = true;
            if known.read().unwrap_or_else(PoisonError::into_inner).contains(&rel) {
                let _ = changes.send(json!({"type": "changed", "path": rel}));
            }
        }
        if structural && inside {
            let _ = tree_tx.send(());
        }
    })
    .context("starting the file watcher")?;
    watcher.watch(root, notify::RecursiveMode::Recursive).with_context(|| format!("watching {}", root.display()))?;
    let root = root.to_path_buf();
    tokio::spawn(async move {
        while tree_rx.recv().await.is_some() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            while tree_rx.try_recv().is_ok() {}
            // The tree is sent again only when what it lists changed.
            let root = root.clone();
            let Ok(Ok(files)) = tokio::task::spawn_blocking(move || listed(&root)).await else { continue };
            let files: HashSet<String> = files.into_iter().collect();
            let mut current = known_files.write().unwrap_or_else(PoisonError::into_inner);
            if *current != files {
                *current = files;
                let _ = tx.send(json!({"type": "tree"}));
            }
        }
    });
    Ok(watcher)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn paths_stay_inside_and_saves_check_their_base() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join("a.txt"), "one\n").unwrap();
        for bad in ["../x", "/etc/passwd", "a/../../x", "", "./a.txt"] {
            assert!(matches!(resolve(&root, bad), Err(FileError::Outside(_))), "{bad}");
        }
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();
        assert!(matches!(resolve(&root, "link/secret"), Err(FileError::Outside(_))));

        let (text, v1) = read(&root, "a.txt").unwrap();
        assert_eq!(text, "one\n");
        let v2 = save(&root, "a.txt", "two\n", Some(&v1)).unwrap();
        // Someone else writes: a save from the old version is refused and nothing is lost.
        std::fs::write(root.join("a.txt"), "theirs\n").unwrap();
        match save(&root, "a.txt", "mine\n", Some(&v2)) {
            Err(FileError::Conflict { text, version: v }) => {
                assert_eq!(text, "theirs\n");
                assert_eq!(v, version(b"theirs\n"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read_to_string(root.join("a.txt")).unwrap(), "theirs\n");
        save(&root, "a.txt", "mine\n", None).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("a.txt")).unwrap(), "mine\n");
        save(&root, "new/dir/b.txt", "b\n", None).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("new/dir/b.txt")).unwrap(), "b\n");
        let names: Vec<String> =
            std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert!(!names.iter().any(|n| n.contains(".tmp")), "{names:?}");

        std::fs::write(root.join("bin"), b"\x00\x01\x02").unwrap();
        assert!(matches!(read(&root, "bin"), Err(FileError::Binary(_))));
        std::fs::write(root.join("latin1"), b"caf\xe9\n").unwrap();
        assert!(matches!(read(&root, "latin1"), Err(FileError::Binary(_))));
        assert!(matches!(read(&root, "missing"), Err(FileError::NotFound(_))));
    }

    /// What the watcher sends: nothing for ignored files, `changed` for a listed file, `tree`
    /// once when a listed file comes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_watcher_speaks_of_listed_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join(".gitignore"), "target/\n").unwrap();
        std::fs::write(root.join("a.py"), "a = 1\n").unwrap();
        std::fs::create_dir(root.join("target")).unwrap();
        let (tx, mut rx) = broadcast::channel(1024);
        let _watcher = watch(&root, tx).unwrap();
        for i in 0..20 {
            std::fs::write(root.join(format!("target/out{i}.o")), "x").unwrap();
        }
        std::fs::write(root.join("a.py"), "a = 2\n").unwrap();
        std::fs::write(root.join("b.py"), "b = 1\n").unwrap();
        let mut seen = Vec::new();
        let until = tokio::time::Instant::now() + Duration::from_secs(4);
        while let Ok(Ok(e)) = tokio::time::timeout_at(until, rx.recv()).await {
            seen.push(e);
        }
        assert!(seen.iter().all(|e| !e.to_string().contains("target/")), "{seen:?}");
        assert!(seen.contains(&json!({"type": "changed", "path": "a.py"})), "{seen:?}");
        assert_eq!(seen.iter().filter(|e| e["type"] == "tree").count(), 1, "{seen:?}");
    }
}
