//! `RelPath`: a path relative to the workspace root, as raw bytes in tree order.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A path relative to the workspace root, stored as raw bytes with `/` separators.
///
/// File names need not be UTF-8; [`fmt::Display`] renders them lossily, while the bytes are
/// kept exactly for hashing, caching and, later, obfuscation.
///
/// Paths order as a tree does: segment by segment, so a directory's entries stay together
/// (`a`, `a/b`, `a-b` rather than the byte order `a`, `a-b`, `a/b`).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct RelPath(Vec<u8>);

impl Ord for RelPath {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Segment order is byte order with the separator below every other byte.
        let key = |b: u8| if b == b'/' { 0 } else { b };
        let (a, b) = (&self.0, &other.0);
        let n = a.len().min(b.len());
        match a[..n].iter().zip(&b[..n]).position(|(x, y)| x != y) {
            Some(i) => key(a[i]).cmp(&key(b[i])),
            None => a.len().cmp(&b.len()),
        }
    }
}

impl PartialOrd for RelPath {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl RelPath {
    /// The root itself (the empty path).
    pub fn root() -> Self {
        RelPath(Vec::new())
    }

    /// Builds a relative path from raw bytes (`/`-separated, no leading slash).
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Self {
        RelPath(bytes.into())
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether this is the root.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// This path with one more segment.
    pub fn join(&self, name: &OsStr) -> Self {
        let mut bytes = Vec::with_capacity(self.0.len() + 1 + name.len());
        bytes.extend_from_slice(&self.0);
        if !bytes.is_empty() {
            bytes.push(b'/');
        }
        bytes.extend_from_slice(name.as_bytes());
        RelPath(bytes)
    }

    /// The segments of the path.
    pub fn segments(&self) -> impl DoubleEndedIterator<Item = &[u8]> {
        self.0.split(|b| *b == b'/').filter(|s| !s.is_empty())
    }

    /// The last segment, or the empty slice for the root.
    pub fn file_name(&self) -> &[u8] {
        self.segments().last().unwrap_or_default()
    }

    /// The path as an OS path relative to the root.
    pub fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0))
    }

    /// The absolute path under `root`.
    pub fn under(&self, root: &Path) -> PathBuf {
        if self.is_root() { root.to_path_buf() } else { root.join(self.as_path()) }
    }

    /// The lowercase extension of the file name, if it is UTF-8.
    pub fn extension(&self) -> Option<String> {
        let name = self.file_name();
        let dot = name.iter().rposition(|b| *b == b'.')?;
        if dot == 0 {
            return None;
        }
        std::str::from_utf8(&name[dot + 1..]).ok().map(str::to_ascii_lowercase)
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

impl serde::Serialize for RelPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&String::from_utf8_lossy(&self.0))
    }
}
