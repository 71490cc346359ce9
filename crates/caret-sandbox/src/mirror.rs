//! Two copies of a workspace kept in step: the worker's, on the host, and the microVM's, on
//! its own disk (Firecracker shares no filesystem with the host). Before a command the host
//! sends what changed on its side since the last exchange; after it, the guest sends what the
//! command changed. Each side compares a fresh [`scan`] with the [`Manifest`] it kept, so an
//! exchange costs a walk of the tree plus the bytes of the files that changed.
//!
//! What counts as a change: a file's size, modification time or mode; a directory's mode; a
//! symbolic link's target; anything added or removed. The receiver records what it wrote as it
//! now stands, so a change never comes back as the receiver's own. Edits made to one file on
//! both sides between two exchanges: the later exchange wins.
//!
//! On the wire a change set is a sequence of records, each a tag byte and then
//! `u32` path length, path bytes (relative, `/`-separated) and, for puts, `u32` mode and `u64`
//! length followed by that many bytes (a file's contents or a link's target); `E` ends it.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// One entry of a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A regular file.
    File {
        /// Bytes.
        size: u64,
        /// Modification time, nanoseconds since the epoch.
        mtime_ns: i128,
        /// Permission bits.
        mode: u32,
    },
    /// A directory.
    Dir {
        /// Permission bits.
        mode: u32,
    },
    /// A symbolic link (never followed).
    Link {
        /// Where it points.
        target: Vec<u8>,
    },
}

/// A tree as last seen: relative path (bytes) → entry. Parents sort before their children.
pub type Manifest = BTreeMap<Vec<u8>, Entry>;

/// What one side changed since the last exchange.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Paths removed (or replaced by another kind of entry), children included.
    pub removed: Vec<Vec<u8>>,
    /// Paths added or changed, parents first.
    pub put: Vec<(Vec<u8>, Entry)>,
}

impl Changes {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.put.is_empty()
    }
}

/// The tree under `root` now (special files — sockets, devices, pipes — are left out).
pub fn scan(root: &Path) -> std::io::Result<Manifest> {
    let mut out = Manifest::new();
    let mut stack = vec![(root.to_path_buf(), Vec::new())];
    while let Some((dir, rel)) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            // Removed while walking: its removal shows at the next exchange.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !rel.is_empty() => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let mut path = rel.clone();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(entry.file_name().as_bytes());
            let Ok(meta) = entry.path().symlink_metadata() else { continue };
            let kind = meta.file_type();
            let mode = meta.permissions().mode() & 0o7777;
            if kind.is_symlink() {
                let Ok(target) = std::fs::read_link(entry.path()) else { continue };
                out.insert(path, Entry::Link { target: target.as_os_str().as_bytes().to_vec() });
            } else if kind.is_dir() {
                out.insert(path.clone(), Entry::Dir { mode });
                stack.push((entry.path(), path));
            } else if kind.is_file() {
                let mtime_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
                out.insert(path, Entry::File { size: meta.len(), mtime_ns, mode });
            }
        }
    }
    Ok(out)
}

/// What differs from `before` in `now`.
pub fn diff(before: &Manifest, now: &Manifest) -> Changes {
    let mut changes = Changes::default();
    for (path, old) in before {
        match now.get(path) {
            None => changes.removed.push(path.clone()),
            Some(new) if std::mem::discriminant(new) != std::mem::discriminant(old) => {
                changes.removed.push(path.clone());
            }
            Some(_) => {}
        }
    }
    for (path, new) in now {
        if before.get(path) != Some(new) {
            changes.put.push((path.clone(), new.clone()));
        }
    }
    changes
}

/// Checks a received relative path: no `..`, no absolute path, no empty or `.` component.
fn checked(root: &Path, rel: &[u8]) -> std::io::Result<PathBuf> {
    let bad = rel.is_empty()
        || rel.starts_with(b"/")
        || rel.split(|b| *b == b'/').any(|c| c.is_empty() || c == b"." || c == b"..");
    if bad {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("refusing path {:?}", String::from_utf8_lossy(rel)),
        ));
    }
    Ok(root.join(std::ffi::OsStr::from_bytes(rel)))
}

/// Refuses a path whose parent directories include a symbolic link (a write through it could
/// land outside the root).
fn no_links_above(root: &Path, rel: &[u8]) -> std::io::Result<()> {
    let mut at = root.to_path_buf();
    let parts: Vec<&[u8]> = rel.split(|b| *b == b'/').collect();
    for part in &parts[..parts.len().saturating_sub(1)] {
        at.push(std::ffi::OsStr::from_bytes(part));
        match at.symlink_metadata() {
            Ok(m) if m.is_symlink() => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("refusing path {:?}: it goes through a symbolic link", String::from_utf8_lossy(rel)),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

fn put_u32(w: &mut impl Write, n: u32) -> std::io::Result<()> {
    w.write_all(&n.to_le_bytes())
}

fn put_u64(w: &mut impl Write, n: u64) -> std::io::Result<()> {
    w.write_all(&n.to_le_bytes())
}

fn get_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn get_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn put_path(w: &mut impl Write, path: &[u8]) -> std::io::Result<()> {
    put_u32(w, u32::try_from(path.len()).map_err(std::io::Error::other)?)?;
    w.write_all(path)
}

/// Longest path accepted.
const PATH_LIMIT: u32 = 16 << 10;

fn get_path(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let n = get_u32(r)?;
    if n > PATH_LIMIT {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "path too long"));
    }
    let mut p = vec![0u8; n as usize];
    r.read_exact(&mut p)?;
    Ok(p)
}

/// Writes `changes` of the tree under `root`, file contents read now. A file that shrank since
/// the scan is padded with zeros (and its new state goes at the next exchange); one removed
/// since is sent empty.
pub fn send(w: &mut impl Write, root: &Path, changes: &Changes) -> std::io::Result<()> {
    for path in &changes.removed {
        w.write_all(b"X")?;
        put_path(w, path)?;
    }
    for (path, entry) in &changes.put {
        match entry {
            Entry::Dir { mode } => {
                w.write_all(b"D")?;
                put_path(w, path)?;
                put_u32(w, *mode)?;
                put_u64(w, 0)?;
            }
            Entry::Link { target } => {
                w.write_all(b"L")?;
                put_path(w, path)?;
                put_u32(w, 0o777)?;
                put_u64(w, target.len() as u64)?;
                w.write_all(target)?;
            }
            Entry::File { size, mode, .. } => {
                w.write_all(b"F")?;
                put_path(w, path)?;
                put_u32(w, *mode)?;
                put_u64(w, *size)?;
                let copied = match std::fs::File::open(checked(root, path)?) {
                    Ok(f) => std::io::copy(&mut f.take(*size), w)?,
                    Err(_) => 0,
                };
                std::io::copy(&mut std::io::repeat(0).take(size - copied), w)?;
            }
        }
    }
    w.write_all(b"E")
}

/// Reads a change set and applies it under `root`, recording in `manifest` what each path is
/// now. Paths that would leave `root` are refused (the whole exchange fails).
pub fn receive(r: &mut impl Read, root: &Path, manifest: &mut Manifest) -> std::io::Result<()> {
    loop {
        let mut tag = [0u8; 1];
        r.read_exact(&mut tag)?;
        if tag[0] == b'E' {
            return Ok(());
        }
        let rel = get_path(r)?;
        let path = checked(root, &rel)?;
        no_links_above(root, &rel)?;
        if tag[0] == b'X' {
            remove(&path)?;
            let mut prefix = rel.clone();
            prefix.push(b'/');
            manifest.retain(|p, _| *p != rel && !p.starts_with(&prefix));
            continue;
        }
        let mode = get_u32(r)?;
        let len = get_u64(r)?;
        // An entry of another kind in the way goes first (a directory that became a file).
        if let Ok(meta) = path.symlink_metadata() {
            let same = match tag[0] {
                b'D' => meta.is_dir(),
                b'F' => meta.is_file(),
                _ => false,
            };
            if !same {
                remove(&path)?;
            }
        }
        match tag[0] {
            b'D' => {
                std::fs::create_dir_all(&path)?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
            }
            b'L' => {
                if len > u64::from(PATH_LIMIT) {
                    return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "link target too long"));
                }
                let mut target = vec![0u8; len as usize];
                r.read_exact(&mut target)?;
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), &path)?;
            }
            b'F' => {
                let mut f = std::fs::File::create(&path)?;
                let copied = std::io::copy(&mut r.take(len), &mut f)?;
                if copied != len {
                    return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "change set cut short"));
                }
                f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            }
            other => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("unknown change record {other:#x}"),
                ));
            }
        }
        // Recorded as it stands now, so that it does not go back as this side's change.
        if let Some(entry) = stat(&path) {
            manifest.insert(rel, entry);
        }
    }
}

/// One path's entry now.
fn stat(path: &Path) -> Option<Entry> {
    let meta = path.symlink_metadata().ok()?;
    let mode = meta.permissions().mode() & 0o7777;
    if meta.is_symlink() {
        Some(Entry::Link { target: std::fs::read_link(path).ok()?.as_os_str().as_bytes().to_vec() })
    } else if meta.is_dir() {
        Some(Entry::Dir { mode })
    } else {
        let mtime_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
        Some(Entry::File { size: meta.len(), mtime_ns, mode })
    }
}

/// Removes a path of any kind; gone already is fine.
fn remove(path: &Path) -> std::io::Result<()> {
    let r = match path.symlink_metadata() {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Sends `a`'s changes since `before` to `b`, as the wire carries them.
    fn exchange(a: &Path, before: &Manifest, b: &Path, b_manifest: &mut Manifest) -> Manifest {
        let now = scan(a).unwrap();
        let mut wire = Vec::new();
        send(&mut wire, a, &diff(before, &now)).unwrap();
        receive(&mut wire.as_slice(), b, b_manifest).unwrap();
        now
    }

    fn tree(root: &Path) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (p, e) in scan(root).unwrap() {
            let p = String::from_utf8(p).unwrap();
            let what = match e {
                Entry::File { mode, .. } => {
                    format!("{:o} {}", mode, std::fs::read_to_string(root.join(&p)).unwrap_or_default())
                }
                Entry::Dir { mode } => format!("dir {mode:o}"),
                Entry::Link { target } => format!("-> {}", String::from_utf8_lossy(&target)),
            };
            out.push((p, what));
        }
        out
    }

    #[test]
    fn changes_on_either_side_reach_the_other_and_never_echo_back() {
        let (a, b) = (caret_test_support::TempDir::new(), caret_test_support::TempDir::new());
        a.write("src/main.rs", "fn main() {}\n");
        a.write("README", "hi\n");
        std::os::unix::fs::symlink("src/main.rs", a.join("link")).unwrap();
        std::fs::set_permissions(a.join("README"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut b_seen = Manifest::new();
        let mut a_seen = exchange(a.path(), &Manifest::new(), b.path(), &mut b_seen);
        assert_eq!(tree(a.path()), tree(b.path()));
        // Nothing changed: nothing to send either way.
        assert!(diff(&a_seen, &scan(a.path()).unwrap()).is_empty());
        assert!(diff(&b_seen, &scan(b.path()).unwrap()).is_empty(), "received changes are not b's own");

        // b (the command) edits, adds, removes, and turns a file into a directory.
        b.write("src/main.rs", "fn main() { println!(\"x\"); }\n");
        b.write("target/out.o", "object");
        std::fs::remove_file(b.join("README")).unwrap();
        std::fs::remove_file(b.join("link")).unwrap();
        std::fs::create_dir(b.join("link")).unwrap();
        b.write("link/inner", "i");
        let before = b_seen.clone();
        b_seen = exchange(b.path(), &before, a.path(), &mut a_seen);
        assert_eq!(tree(a.path()), tree(b.path()));
        assert!(diff(&a_seen, &scan(a.path()).unwrap()).is_empty(), "nothing echoes back");

        // a (the host) removes a directory with children.
        std::fs::remove_dir_all(a.join("target")).unwrap();
        let before = a_seen.clone();
        exchange(a.path(), &before, b.path(), &mut b_seen);
        assert_eq!(tree(a.path()), tree(b.path()));
        assert!(!b.join("target").exists());
    }

    #[test]
    fn paths_leaving_the_root_are_refused() {
        let root = caret_test_support::TempDir::new();
        // A file record claiming `len` bytes, followed by `rest`.
        let file = |path: &[u8], len: u64, rest: &[u8]| {
            let mut wire = vec![b'F'];
            wire.extend_from_slice(&(path.len() as u32).to_le_bytes());
            wire.extend_from_slice(path);
            wire.extend_from_slice(&0o644u32.to_le_bytes());
            wire.extend_from_slice(&len.to_le_bytes());
            wire.extend_from_slice(rest);
            wire
        };
        for bad in [&b"../escape"[..], b"/etc/passwd", b"a/../../b", b"", b"a//b"] {
            let wire = file(bad, 1, b"xE");
            let err = receive(&mut wire.as_slice(), root.path(), &mut Manifest::new()).unwrap_err();
            assert!(err.to_string().contains("refusing path"), "{err}");
        }
        // Nothing is written through a symbolic link.
        let outside = caret_test_support::TempDir::new();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        let wire = file(b"out/f", 1, b"xE");
        let err = receive(&mut wire.as_slice(), root.path(), &mut Manifest::new()).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(!outside.join("f").exists());
        // A cut-short change set is an error, not a silently short file.
        let wire = file(b"f", 100, b"short");
        assert!(receive(&mut wire.as_slice(), root.path(), &mut Manifest::new()).is_err());
    }
}
