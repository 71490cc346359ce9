//! Prepared environments, kept per worker: what a repository's `install` step left in the
//! workspace, so that later runs of the same environment start without installing again.
//!
//! **Key.** An environment is the tenant, the repository (its root commits, the same for a
//! clone and for an uploaded bundle of it), the install commands, and the contents of the
//! files the environment file names as `install_inputs` (lock files, say). Two tenants never
//! share a snapshot.
//!
//! **What is kept.** After a cold run's install step, every path git does not track (ignored
//! files included: `node_modules`, `.venv`, `target`) is copied into the snapshot — the
//! install's outputs, not the code, which each run checks out itself. Tracked files an install
//! rewrites are not kept (the checkout has the committed ones). A snapshot is written to a
//! temporary directory and renamed into place, so a crash never leaves half of one; after
//! that it is never written again.
//!
//! **Warm start.** Where the worker may mount (root, and a kernel with overlayfs), the run's
//! workspace is an overlay: the snapshot over the fresh checkout as read-only layers, the
//! run's own writes in an upper directory — constant time whatever the snapshot's size, and
//! the snapshot is untouched. Elsewhere the snapshot is copied in (`cp --reflink=auto`:
//! copy-on-write extents on btrfs and XFS, a plain copy on ext4).
//!
//! **Eviction.** At most `max` snapshots, the least recently used removed first, never one a
//! running attempt is using.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use sha2::{Digest as _, Sha256};

/// How a snapshot becomes a run's workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// An overlay mount (copy-on-write, constant time).
    Overlay,
    /// A copy (`cp -a --reflink=auto`).
    Copy,
}

impl Method {
    /// Its name, for events and figures.
    pub fn name(self) -> &'static str {
        match self {
            Method::Overlay => "overlay",
            Method::Copy => "copy",
        }
    }
}

/// A worker's snapshots.
#[derive(Debug)]
pub struct Snapshots {
    dir: PathBuf,
    max: usize,
    method: OnceLock<Method>,
    /// Snapshots in use by running attempts (not evicted meanwhile).
    in_use: Mutex<HashMap<String, usize>>,
    /// The work directory's lock, while this worker holds it.
    claimed: Mutex<Option<std::fs::File>>,
}

/// A workspace made from a snapshot; dropping it releases the snapshot (and unmounts an
/// overlay).
#[derive(Debug)]
pub struct Workspace {
    snapshots: Arc<Snapshots>,
    key: String,
    mounted: Option<PathBuf>,
    /// How it was made.
    pub method: Method,
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if let Some(at) = &self.mounted {
            unmount(at);
        }
        let mut in_use = self.snapshots.in_use.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = in_use.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                in_use.remove(&self.key);
            }
        }
    }
}

fn unmount(at: &Path) {
    let _ = std::process::Command::new("umount").arg("-l").arg(at).status();
}

fn run(command: &mut std::process::Command) -> Result<(), String> {
    let out = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{command:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// A path usable in overlayfs' option string (no separators of its own).
fn option_safe(p: &Path) -> bool {
    p.to_str().is_some_and(|s| !s.contains([',', ':', '\\']))
}

impl Snapshots {
    /// Snapshots under `dir`, at most `max`.
    pub fn new(dir: PathBuf, max: usize) -> Snapshots {
        Snapshots { dir, max: max.max(1), method: OnceLock::new(), in_use: Mutex::default(), claimed: Mutex::default() }
    }

    /// Claims `work_dir` for this worker (a lock file held while the snapshots live) and
    /// unmounts the overlay mounts a crashed worker left under it. A directory another live
    /// worker holds is left alone (its mounts are in use): answers whether the claim held.
    pub fn claim(&self, work_dir: &Path) -> bool {
        let lock = std::fs::create_dir_all(work_dir).and_then(|()| {
            std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(work_dir.join(".worker.lock"))
        });
        let Ok(lock) = lock else { return false };
        if lock.try_lock().is_err() {
            tracing::warn!(dir = %work_dir.display(), "another worker uses this directory: its mounts are left alone");
            return false;
        }
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") {
            for line in mounts.lines() {
                let mut fields = line.split(' ');
                let (Some(kind), Some(at)) = (fields.next(), fields.next()) else { continue };
                if kind == "overlay" && Path::new(at).starts_with(work_dir) {
                    unmount(Path::new(at));
                }
            }
        }
        *self.claimed.lock().unwrap_or_else(PoisonError::into_inner) = Some(lock);
        true
    }

    /// Makes workspaces by `method` only (copies where overlays would work, say).
    pub fn with_method(self, method: Method) -> Snapshots {
        let _ = self.method.set(method);
        self
    }

    /// The key of an environment (see the module's notes).
    pub fn key(tenant: &str, roots: &str, install: &[String], inputs: &[(String, Option<Vec<u8>>)]) -> String {
        let mut h = Sha256::new();
        let mut part = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        part(b"caret-environment-v1");
        part(tenant.as_bytes());
        part(roots.as_bytes());
        for c in install {
            part(c.as_bytes());
        }
        for (path, content) in inputs {
            part(path.as_bytes());
            match content {
                Some(c) => part(c),
                None => part(b"\0absent"),
            }
        }
        let d = h.finalize();
        d.iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    /// How workspaces are made here: an overlay if one can be mounted (tried once).
    pub fn method(&self) -> Method {
        *self.method.get_or_init(|| {
            let probe = self.dir.join(format!(".probe-{}", std::process::id()));
            let dirs = ["lower", "upper", "work", "merged"].map(|d| probe.join(d));
            let made = dirs.iter().all(|d| std::fs::create_dir_all(d).is_ok());
            let ok =
                made && option_safe(&probe) && mount_overlay(&[&dirs[0]], &dirs[1], &dirs[2], &dirs[3]).is_ok() && {
                    let wrote = std::fs::write(dirs[3].join("f"), "x").is_ok() && !dirs[0].join("f").exists();
                    unmount(&dirs[3]);
                    wrote
                };
            let _ = std::fs::remove_dir_all(&probe);
            if ok { Method::Overlay } else { Method::Copy }
        })
    }

    /// The snapshot of `key`, if one is ready.
    pub fn get(&self, key: &str) -> Option<PathBuf> {
        let at = self.dir.join(key);
        at.join("tree").is_dir().then_some(at)
    }

    /// Keeps the install outputs of `repo` (paths git does not track) as the snapshot of
    /// `key`. Another attempt saving the same key at once is harmless: one rename wins.
    pub fn save(&self, key: &str, repo: &Path) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let out = std::process::Command::new("git")
            .args(["ls-files", "-z", "--others", "--directory", "--no-empty-directory"])
            .current_dir(repo)
            .output()
            .map_err(|e| format!("git ls-files: {e}"))?;
        if !out.status.success() {
            return Err(format!("git ls-files: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        let tmp = self.dir.join(format!(".tmp-{key}-{}", fastrand::u64(..)));
        let tree = tmp.join("tree");
        std::fs::create_dir_all(&tree).map_err(|e| format!("{}: {e}", tree.display()))?;
        let paths: Vec<&[u8]> = out.stdout.split(|b| *b == 0).filter(|p| !p.is_empty()).collect();
        if !paths.is_empty() {
            let mut cp = std::process::Command::new("cp");
            cp.args(["-a", "--reflink=auto", "--parents", "--"]).current_dir(repo);
            for p in &paths {
                let p = std::str::from_utf8(p).map_err(|_| "an install output's name is not UTF-8".to_owned())?;
                cp.arg(p.trim_end_matches('/'));
            }
            cp.arg(&tree);
            if let Err(e) = run(&mut cp) {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e);
            }
        }
        // Saved counts as used: the newest snapshot is not the first evicted.
        let _ = std::fs::write(tmp.join("used"), crate::now_ms().to_string());
        let at = self.dir.join(key);
        if std::fs::rename(&tmp, &at).is_err() {
            // Saved meanwhile by another attempt.
            let _ = std::fs::remove_dir_all(&tmp);
        }
        self.evict();
        Ok(())
    }

    /// Makes `repo` the run's workspace: the snapshot's tree over the checkout in `code`.
    /// With an overlay, `repo` is the mount and `scratch` holds the run's writes; with a copy,
    /// the snapshot is copied into `code`, which is renamed to `repo`.
    pub fn materialize(
        self: &Arc<Self>,
        key: &str,
        code: &Path,
        repo: &Path,
        scratch: &Path,
    ) -> Result<Workspace, String> {
        let Some(at) = self.get(key) else { return Err(format!("no snapshot {key}")) };
        let tree = at.join("tree");
        *self.in_use.lock().unwrap_or_else(PoisonError::into_inner).entry(key.to_owned()).or_default() += 1;
        let mut ws = Workspace { snapshots: self.clone(), key: key.to_owned(), mounted: None, method: self.method() };
        // Recently used: kept longest.
        let _ = std::fs::write(at.join("used"), crate::now_ms().to_string());
        let overlay = ws.method == Method::Overlay && [&tree, code, repo, scratch].iter().all(|p| option_safe(p));
        if overlay {
            let (upper, work) = (scratch.join("upper"), scratch.join("work"));
            for d in [&upper, &work, &repo.to_path_buf()] {
                std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            }
            if mount_overlay(&[&tree, code], &upper, &work, repo).is_ok() {
                ws.mounted = Some(repo.to_path_buf());
                return Ok(ws);
            }
            let _ = std::fs::remove_dir(repo);
        }
        ws.method = Method::Copy;
        run(std::process::Command::new("cp").args(["-a", "--reflink=auto", "--"]).arg(tree.join(".")).arg(code))?;
        std::fs::rename(code, repo).map_err(|e| format!("{}: {e}", repo.display()))?;
        Ok(ws)
    }

    /// Removes the least recently used snapshots beyond `max` (none in use).
    fn evict(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let mut all: Vec<(i64, String)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_owned();
                if name.starts_with('.') {
                    return None;
                }
                let used = std::fs::read_to_string(e.path().join("used")).ok().and_then(|t| t.trim().parse().ok());
                Some((used.unwrap_or(0), name))
            })
            .collect();
        if all.len() <= self.max {
            return;
        }
        all.sort();
        let in_use = self.in_use.lock().unwrap_or_else(PoisonError::into_inner);
        let mut extra = all.len() - self.max;
        for (_, name) in all {
            if extra == 0 {
                break;
            }
            if in_use.contains_key(&name) {
                continue;
            }
            let _ = std::fs::remove_dir_all(self.dir.join(&name));
            extra -= 1;
        }
    }
}

/// Mounts an overlay of `lower` (the first on top) with writes in `upper`, at `at`.
fn mount_overlay(lower: &[&Path], upper: &Path, work: &Path, at: &Path) -> Result<(), String> {
    let lower: Vec<String> = lower.iter().map(|p| p.display().to_string()).collect();
    let options = format!("lowerdir={},upperdir={},workdir={}", lower.join(":"), upper.display(), work.display());
    run(std::process::Command::new("mount").args(["-t", "overlay", "overlay", "-o", &options]).arg(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_untracked_outputs_are_kept_and_the_least_recently_used_go_first_unless_in_use() {
        let repo = caret_test_support::TempDir::new();
        repo.write("code.txt", "tracked\n");
        repo.git_init();
        repo.git(&["add", "-A"]);
        repo.git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "i"]);
        repo.write("deps/lib/a.txt", "output\n");
        repo.write("built.o", "output\n");
        let work = caret_test_support::TempDir::new();
        let snaps = Arc::new(Snapshots::new(work.join("snapshots"), 2).with_method(Method::Copy));
        snaps.save("one", repo.path()).unwrap();
        let tree = snaps.get("one").unwrap().join("tree");
        assert!(tree.join("deps/lib/a.txt").is_file() && tree.join("built.o").is_file());
        assert!(!tree.join("code.txt").exists() && !tree.join(".git").exists(), "the code is not kept");

        // "one" is in use while two more are saved: the least recently used other goes.
        let code = work.join("run/code");
        std::fs::create_dir_all(&code).unwrap();
        std::fs::write(code.join("code.txt"), "tracked\n").unwrap();
        let ws = snaps.materialize("one", &code, &work.join("run/repo"), &work.join("run/overlay")).unwrap();
        assert_eq!(std::fs::read_to_string(work.join("run/repo/deps/lib/a.txt")).unwrap(), "output\n");
        std::thread::sleep(std::time::Duration::from_millis(5));
        snaps.save("two", repo.path()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        snaps.save("three", repo.path()).unwrap();
        assert!(snaps.get("one").is_some() && snaps.get("two").is_none() && snaps.get("three").is_some());
        drop(ws);
        std::thread::sleep(std::time::Duration::from_millis(5));
        snaps.save("four", repo.path()).unwrap();
        assert!(snaps.get("one").is_none(), "released, it is the oldest");
        assert!(snaps.get("three").is_some() && snaps.get("four").is_some());
    }

    #[test]
    fn keys_change_with_every_part_and_tenants_never_share() {
        let base =
            Snapshots::key("t1", "abc", &["npm ci".into()], &[("package-lock.json".into(), Some(b"1".to_vec()))]);
        assert_eq!(base.len(), 32);
        assert_ne!(
            base,
            Snapshots::key("t2", "abc", &["npm ci".into()], &[("package-lock.json".into(), Some(b"1".to_vec()))])
        );
        assert_ne!(
            base,
            Snapshots::key("t1", "abd", &["npm ci".into()], &[("package-lock.json".into(), Some(b"1".to_vec()))])
        );
        assert_ne!(
            base,
            Snapshots::key("t1", "abc", &["npm i".into()], &[("package-lock.json".into(), Some(b"1".to_vec()))])
        );
        assert_ne!(
            base,
            Snapshots::key("t1", "abc", &["npm ci".into()], &[("package-lock.json".into(), Some(b"2".to_vec()))])
        );
        assert_ne!(base, Snapshots::key("t1", "abc", &["npm ci".into()], &[("package-lock.json".into(), None)]));
    }
}
