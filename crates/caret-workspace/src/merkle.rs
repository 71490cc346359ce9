//! The Merkle tree of a workspace: leaf = a file's content hash, directory = the hash of its
//! sorted `(name, kind, child hash)` entries. Equal hashes mean equal subtrees, so [`diff`]
//! descends only into directories whose hashes differ.
//!
//! A directory's entries are shared between copies of a tree: cloning one is a pointer, and
//! a change copies only the directories on its path.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::{ContentHash, RelPath};

/// A node of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A file, by content hash.
    File(ContentHash),
    /// A directory, with the hash of its entries.
    Dir {
        /// The directory's hash.
        hash: ContentHash,
        /// Entries by name (raw bytes, sorted), shared between copies of the tree.
        children: Arc<BTreeMap<Vec<u8>, Node>>,
    },
}

impl Node {
    /// The node's hash.
    pub fn hash(&self) -> ContentHash {
        match self {
            Node::File(h) | Node::Dir { hash: h, .. } => *h,
        }
    }

    /// A directory node with its hash computed from `children`.
    fn dir(children: BTreeMap<Vec<u8>, Node>) -> Node {
        Node::Dir { hash: hash_children(&children), children: Arc::new(children) }
    }

    /// Files in this subtree.
    fn count(&self) -> usize {
        match self {
            Node::File(_) => 1,
            Node::Dir { children, .. } => children.values().map(Node::count).sum(),
        }
    }
}

fn hash_children(children: &BTreeMap<Vec<u8>, Node>) -> ContentHash {
    let mut hasher = DirHasher::new();
    for (name, child) in children {
        hasher.entry(matches!(child, Node::Dir { .. }), name, child.hash());
    }
    hasher.finish()
}

/// Sets the file at `segments` below `node` (a directory) to `hash`, rehashing the directories
/// on the way back up. `None` (nothing changed) where the path names a directory or passes
/// through a file; else whether the file is new.
fn insert_below(node: &mut Node, segments: &[&[u8]], hash: ContentHash) -> Option<bool> {
    let Node::Dir { hash: dir_hash, children } = node else { return None };
    let (first, rest) = segments.split_first()?;
    // Refusals first, before a shared directory is copied for nothing.
    match (children.get(*first), rest.is_empty()) {
        (Some(Node::Dir { .. }), true) | (Some(Node::File(_)), false) => return None,
        _ => {}
    }
    let children = Arc::make_mut(children);
    let added = if rest.is_empty() {
        match children.get_mut(*first) {
            Some(Node::Dir { .. }) => return None,
            Some(file) => {
                *file = Node::File(hash);
                false
            }
            None => {
                children.insert(first.to_vec(), Node::File(hash));
                true
            }
        }
    } else {
        match children.get_mut(*first) {
            Some(child) => insert_below(child, rest, hash)?,
            None => {
                let mut child = Node::Dir { hash: ContentHash::default(), children: Arc::default() };
                let added = insert_below(&mut child, rest, hash)?;
                children.insert(first.to_vec(), child);
                added
            }
        }
    };
    *dir_hash = hash_children(children);
    Some(added)
}

/// Removes what `segments` names below `node` (a directory) and the directories that leaves
/// empty, rehashing the ones on the way back up; the files removed.
fn remove_below(node: &mut Node, segments: &[&[u8]]) -> usize {
    let Node::Dir { hash: dir_hash, children } = node else { return 0 };
    let Some((first, rest)) = segments.split_first() else { return 0 };
    if !children.contains_key(*first) {
        return 0;
    }
    let children = Arc::make_mut(children);
    let removed = if rest.is_empty() {
        children.remove(*first).map_or(0, |gone| gone.count())
    } else {
        let Some(child) = children.get_mut(*first) else { return 0 };
        let removed = remove_below(child, rest);
        if matches!(child, Node::Dir { children, .. } if children.is_empty()) {
            children.remove(*first);
        }
        removed
    };
    if removed > 0 {
        *dir_hash = hash_children(children);
    }
    removed
}

/// A directory's hash, over its `(kind, name, hash)` entries in name order.
struct DirHasher(blake3::Hasher);

impl DirHasher {
    fn new() -> DirHasher {
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"caret-merkle-dir-v1\0");
        DirHasher(hasher)
    }

    fn entry(&mut self, dir: bool, name: &[u8], hash: ContentHash) {
        self.0.update(&[u8::from(dir)]);
        self.0.update(&u32::try_from(name.len()).unwrap_or(u32::MAX).to_le_bytes());
        self.0.update(name);
        self.0.update(&hash.0);
    }

    fn finish(self) -> ContentHash {
        self.0.finalize().into()
    }
}

/// A Merkle tree over a workspace's indexed files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MerkleTree {
    root: Node,
    files: usize,
}

impl Default for MerkleTree {
    fn default() -> Self {
        Self::from_files(std::iter::empty::<(RelPath, ContentHash)>())
    }
}

impl MerkleTree {
    /// Builds a tree from `(path, content hash)` pairs.
    ///
    /// For a repeated path the last pair wins; where a path is both a file and a directory's
    /// prefix (`a` and `a/b`), the directory wins.
    pub fn from_files<P: std::borrow::Borrow<RelPath>>(files: impl IntoIterator<Item = (P, ContentHash)>) -> Self {
        let mut items: Vec<(P, ContentHash)> = files.into_iter().collect();
        // Path order is segment order, which keeps each directory's entries together; the
        // stable sort keeps the last of equal paths last (and is linear on sorted input).
        if !items.is_sorted_by(|a, b| a.0.borrow() <= b.0.borrow()) {
            items.sort_by(|a, b| a.0.borrow().cmp(b.0.borrow()));
        }
        let mut deduped: Vec<(&[u8], ContentHash)> = Vec::with_capacity(items.len());
        for (path, hash) in &items {
            let path: &RelPath = path.borrow();
            if path.is_root() {
                continue;
            }
            match deduped.last_mut() {
                Some(last) if last.0 == path.as_bytes() => last.1 = *hash,
                _ => deduped.push((path.as_bytes(), *hash)),
            }
        }
        let mut count = 0;
        let root = build(&deduped, 0, &mut count);
        MerkleTree { root, files: count }
    }

    /// The root hash.
    pub fn root_hash(&self) -> ContentHash {
        self.root.hash()
    }

    /// The root hash [`MerkleTree::from_files`] gives for `items` (`file` giving each one's
    /// path and hash), without building the tree (no node, no name copied): what a scan that
    /// only reports the root needs.
    pub fn root_hash_by<T>(items: &[T], file: impl Fn(&T) -> (&RelPath, ContentHash) + Copy) -> ContentHash {
        let sorted_unique = items.windows(2).all(|w| file(&w[0]).0 < file(&w[1]).0);
        if !sorted_unique || items.iter().any(|i| file(i).0.is_root()) {
            return Self::from_files(items.iter().map(file)).root_hash();
        }
        hash_dir(items, 0, |i| {
            let (p, h) = file(i);
            (p.as_bytes(), h)
        })
    }

    /// The root node.
    pub fn root(&self) -> &Node {
        &self.root
    }

    /// Number of files.
    pub fn len(&self) -> usize {
        self.files
    }

    /// Whether the tree has no files.
    pub fn is_empty(&self) -> bool {
        self.files == 0
    }

    /// The node at `path`, if any.
    pub fn get(&self, path: &RelPath) -> Option<&Node> {
        let mut node = &self.root;
        for segment in path.segments() {
            match node {
                Node::Dir { children, .. } => node = children.get(segment)?,
                Node::File(_) => return None,
            }
        }
        Some(node)
    }

    /// Sets the file at `path` to `hash`, rehashing only the directories above it: what
    /// [`MerkleTree::from_files`] would build with the file added or replaced. Refused
    /// (`false`, the tree unchanged) where that build would differ — `path` names a directory,
    /// passes through a file, is the root or has an empty segment — and the caller builds anew.
    pub fn insert(&mut self, path: &RelPath, hash: ContentHash) -> bool {
        let Some(segments) = plain_segments(path) else { return false };
        match insert_below(&mut self.root, &segments, hash) {
            Some(added) => {
                self.files += usize::from(added);
                true
            }
            None => false,
        }
    }

    /// Removes the file or the directory at `path` (every file below it), and the
    /// directories that leaves empty, rehashing only those above: what
    /// [`MerkleTree::from_files`] would build without those files. Refused (`false`, the tree
    /// unchanged) for the root or a path with an empty segment; a path naming nothing changes
    /// nothing.
    pub fn remove(&mut self, path: &RelPath) -> bool {
        let Some(segments) = plain_segments(path) else { return false };
        self.files -= remove_below(&mut self.root, &segments);
        true
    }

    /// Every file with its hash, in path order.
    pub fn files(&self) -> Vec<(RelPath, ContentHash)> {
        let mut out = Vec::with_capacity(self.files);
        collect(&self.root, &RelPath::root(), &mut out);
        out
    }
}

/// A path's segments, where it has at least one and none is empty.
fn plain_segments(path: &RelPath) -> Option<Vec<&[u8]>> {
    let segments: Vec<&[u8]> = path.as_bytes().split(|b| *b == b'/').collect();
    (!path.as_bytes().is_empty() && segments.iter().all(|s| !s.is_empty())).then_some(segments)
}

/// The entries of the directory holding `items`, whose paths (`path`) share their first
/// `offset` bytes and are sorted by segments: each name, the file of that name if any, and
/// the items below it (a name with items below is a directory, whatever file it also names).
fn entries<'a, T>(
    items: &'a [T],
    offset: usize,
    path: impl Fn(&'a T) -> &'a [u8],
) -> impl Iterator<Item = (&'a [u8], Option<&'a T>, &'a [T])> {
    let mut i = 0;
    std::iter::from_fn(move || {
        let first = items.get(i)?;
        let rest = &path(first)[offset..];
        let seg = &rest[..memchr::memchr(b'/', rest).unwrap_or(rest.len())];
        let in_group = |p: &[u8]| {
            let r = &p[offset..];
            r.starts_with(seg) && (r.len() == seg.len() || r[seg.len()] == b'/')
        };
        let end = i + items[i..].iter().take_while(|item| in_group(path(item))).count();
        // Segment order puts a file `seg` before anything below `seg/`.
        let leaf = (path(first).len() == offset + seg.len()).then_some(first);
        let below = &items[i + usize::from(leaf.is_some())..end];
        i = end;
        Some((seg, leaf, below))
    })
}

/// Builds the directory holding `items` (see [`entries`]).
fn build(items: &[(&[u8], ContentHash)], offset: usize, count: &mut usize) -> Node {
    let mut children = BTreeMap::new();
    for (seg, leaf, below) in entries(items, offset, |(p, _)| p) {
        let node = if below.is_empty() {
            *count += 1;
            Node::File(leaf.map(|(_, h)| *h).unwrap_or_default())
        } else {
            build(below, offset + seg.len() + 1, count)
        };
        children.insert(seg.to_vec(), node);
    }
    Node::dir(children)
}

/// The hash [`build`] gives the directory holding `items`, hashing as it goes.
fn hash_dir<T>(items: &[T], offset: usize, file: impl Fn(&T) -> (&[u8], ContentHash) + Copy) -> ContentHash {
    let mut hasher = DirHasher::new();
    for (seg, leaf, below) in entries(items, offset, |item| file(item).0) {
        if below.is_empty() {
            hasher.entry(false, seg, leaf.map(|item| file(item).1).unwrap_or_default());
        } else {
            hasher.entry(true, seg, hash_dir(below, offset + seg.len() + 1, file));
        }
    }
    hasher.finish()
}

fn collect(node: &Node, at: &RelPath, out: &mut Vec<(RelPath, ContentHash)>) {
    match node {
        Node::File(h) => out.push((at.clone(), *h)),
        Node::Dir { children, .. } => {
            for (name, child) in children.iter() {
                collect(child, &RelPath::from_bytes(join(at, name)), out);
            }
        }
    }
}

fn join(at: &RelPath, name: &[u8]) -> Vec<u8> {
    let mut bytes = at.as_bytes().to_vec();
    if !bytes.is_empty() {
        bytes.push(b'/');
    }
    bytes.extend_from_slice(name);
    bytes
}

/// What changed between two trees.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeDiff {
    /// Files only in the new tree, with their hashes.
    pub added: Vec<(RelPath, ContentHash)>,
    /// Files in both whose hashes differ, with their new hashes.
    pub modified: Vec<(RelPath, ContentHash)>,
    /// Files only in the old tree.
    pub deleted: Vec<RelPath>,
    /// Nodes compared: a measure of the work done, proportional to what changed.
    pub visited: usize,
}

impl TreeDiff {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.modified.is_empty() && self.deleted.is_empty()
    }

    /// Applies this diff to `old`, giving the new tree.
    pub fn apply(&self, old: &MerkleTree) -> MerkleTree {
        let mut files: BTreeMap<RelPath, ContentHash> = old.files().into_iter().collect();
        // (BTreeMap iterates in path order, which is what from_files expects.)
        for path in &self.deleted {
            files.remove(path);
        }
        for (path, hash) in self.added.iter().chain(&self.modified) {
            files.insert(path.clone(), *hash);
        }
        MerkleTree::from_files(files)
    }
}

/// Compares two trees, visiting only subtrees whose hashes differ. Paths come out sorted.
pub fn diff(old: &MerkleTree, new: &MerkleTree) -> TreeDiff {
    let mut out = TreeDiff::default();
    diff_node(Some(&old.root), Some(&new.root), &RelPath::root(), &mut out);
    out
}

fn diff_node(old: Option<&Node>, new: Option<&Node>, at: &RelPath, out: &mut TreeDiff) {
    out.visited += 1;
    match (old, new) {
        (Some(o), Some(n)) if o.hash() == n.hash() && o_kind(o) == o_kind(n) => {}
        (Some(Node::File(_)), Some(Node::File(h))) => out.modified.push((at.clone(), *h)),
        (Some(Node::Dir { children: oc, .. }), Some(Node::Dir { children: nc, .. })) => {
            let mut o_iter = oc.iter().peekable();
            let mut n_iter = nc.iter().peekable();
            loop {
                let (name, o, n) = match (o_iter.peek(), n_iter.peek()) {
                    (None, None) => break,
                    (Some((on, _)), Some((nn, _))) if on == nn => {
                        let (name, o) = o_iter.next().unzip_pair();
                        let (_, n) = n_iter.next().unzip_pair();
                        (name, o, n)
                    }
                    (Some((on, _)), Some((nn, _))) if on < nn => {
                        let (name, o) = o_iter.next().unzip_pair();
                        (name, o, None)
                    }
                    (Some(_), None) => {
                        let (name, o) = o_iter.next().unzip_pair();
                        (name, o, None)
                    }
                    _ => {
                        let (name, n) = n_iter.next().unzip_pair();
                        (name, None, n)
                    }
                };
                diff_node(o, n, &RelPath::from_bytes(join(at, name)), out);
            }
        }
        (old, new) => {
            // One side is missing, or a file became a directory (or back): all of the old
            // subtree is deleted and all of the new one added.
            if let Some(o) = old {
                let mut gone = Vec::new();
                collect(o, at, &mut gone);
                out.deleted.extend(gone.into_iter().map(|(p, _)| p));
            }
            if let Some(n) = new {
                collect(n, at, &mut out.added);
            }
        }
    }
}

fn o_kind(n: &Node) -> bool {
    matches!(n, Node::Dir { .. })
}

trait UnzipPair<'a> {
    fn unzip_pair(self) -> (&'a [u8], Option<&'a Node>);
}

impl<'a> UnzipPair<'a> for Option<(&'a Vec<u8>, &'a Node)> {
    fn unzip_pair(self) -> (&'a [u8], Option<&'a Node>) {
        match self {
            Some((name, node)) => (name.as_slice(), Some(node)),
            None => (&[], None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> ContentHash {
        ContentHash::of(s.as_bytes())
    }

    /// A copy of a tree changed in one file: the original is unchanged, and the copy shares
    /// every directory off the changed file's path with it.
    #[test]
    fn a_changed_copy_shares_the_directories_it_did_not_touch() {
        let files: Vec<(RelPath, ContentHash)> = ["a/x.rs", "a/y.rs", "b/c/z.rs", "b/w.rs", "top.rs"]
            .iter()
            .map(|p| (RelPath::from_bytes(p.as_bytes()), h(p)))
            .collect();
        let original = MerkleTree::from_files(files.clone());
        let mut copy = original.clone();
        assert!(copy.insert(&RelPath::from_bytes(b"b/c/z.rs"), h("changed")));
        assert!(copy.remove(&RelPath::from_bytes(b"top.rs")));
        assert_eq!(original, MerkleTree::from_files(files.clone()), "the original is untouched");
        let mut changed = files;
        changed[2].1 = h("changed");
        changed.pop();
        assert_eq!(copy, MerkleTree::from_files(changed), "the copy is what a build gives");
        let dir = |t: &MerkleTree, name: &[u8]| match t.get(&RelPath::from_bytes(name)) {
            Some(Node::Dir { children, .. }) => children.clone(),
            _ => panic!("no directory {name:?}"),
        };
        assert!(Arc::ptr_eq(&dir(&original, b"a"), &dir(&copy, b"a")), "a/ is shared");
        assert!(!Arc::ptr_eq(&dir(&original, b"b"), &dir(&copy, b"b")), "b/ is on the changed path");
    }

    fn tree(files: &[(&str, &str)]) -> MerkleTree {
        MerkleTree::from_files(files.iter().map(|(p, c)| (RelPath::from_bytes(*p), h(c))))
    }

    fn random_tree(rng: &mut fastrand::Rng) -> MerkleTree {
        let n = rng.usize(0..60);
        let files = (0..n).map(|_| {
            let depth = rng.usize(1..4);
            let path: Vec<String> = (0..depth).map(|_| format!("{}", rng.u8(0..4))).collect();
            (RelPath::from_bytes(path.join("/")), h(&rng.u8(0..3).to_string()))
        });
        MerkleTree::from_files(files)
    }

    #[test]
    fn root_hash_depends_on_names_contents_and_shape() {
        let a = tree(&[("src/a.rs", "1"), ("src/b.rs", "2")]);
        assert_eq!(a.root_hash(), tree(&[("src/b.rs", "2"), ("src/a.rs", "1")]).root_hash(), "order-free");
        assert_ne!(a.root_hash(), tree(&[("src/a.rs", "1"), ("src/b.rs", "3")]).root_hash());
        assert_ne!(a.root_hash(), tree(&[("src/a.rs", "1"), ("src/c.rs", "2")]).root_hash());
        assert_ne!(a.root_hash(), tree(&[("src/a.rs", "1"), ("b.rs", "2")]).root_hash());
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn the_root_alone_is_the_built_trees_root() {
        let mut rng = fastrand::Rng::with_seed(7);
        let names = ["a", "a.b", "a-b", "ab", "b", "A", "a b", "é"];
        for _ in 0..300 {
            let n = rng.usize(0..40);
            let mut files: Vec<(RelPath, ContentHash)> = (0..n)
                .map(|_| {
                    let depth = rng.usize(1..4);
                    let path: Vec<&str> = (0..depth).map(|_| names[rng.usize(0..names.len())]).collect();
                    (RelPath::from_bytes(path.join("/")), h(&rng.u8(0..3).to_string()))
                })
                .collect();
            let built = MerkleTree::from_files(files.clone()).root_hash();
            // Unsorted, repeated, a file that is also a directory: the same answer.
            assert_eq!(MerkleTree::root_hash_by(&files, |(p, h)| (p, *h)), built);
            files.sort_by(|a, b| a.0.cmp(&b.0));
            files.dedup_by(|later, earlier| later.0 == earlier.0);
            assert_eq!(
                MerkleTree::root_hash_by(&files, |(p, h)| (p, *h)),
                MerkleTree::from_files(files.clone()).root_hash()
            );
        }
        assert_eq!(
            MerkleTree::root_hash_by::<(RelPath, ContentHash)>(&[], |(p, h)| (p, *h)),
            MerkleTree::default().root_hash()
        );
    }

    #[test]
    fn changes_in_place_build_what_a_fresh_build_does() {
        let mut rng = fastrand::Rng::with_seed(11);
        let names = ["a", "a.b", "b", "c"];
        let random_path = |rng: &mut fastrand::Rng| {
            let depth = rng.usize(1..4);
            (0..depth).map(|_| names[rng.usize(0..names.len())]).collect::<Vec<_>>().join("/")
        };
        for _ in 0..200 {
            let mut files: BTreeMap<String, ContentHash> = BTreeMap::new();
            let mut tree = MerkleTree::default();
            for _ in 0..rng.usize(1..40) {
                let path = random_path(&mut rng);
                let built = |files: &BTreeMap<String, ContentHash>| {
                    MerkleTree::from_files(files.iter().map(|(p, h)| (RelPath::from_bytes(p.as_str()), *h)))
                };
                if rng.u8(0..4) == 0 {
                    assert!(tree.remove(&RelPath::from_bytes(path.as_str())));
                    let below = format!("{path}/");
                    files.retain(|p, _| *p != path && !p.starts_with(&below));
                } else {
                    let hash = h(&rng.u8(0..3).to_string());
                    let mut with = files.clone();
                    with.insert(path.clone(), hash);
                    if tree.insert(&RelPath::from_bytes(path.as_str()), hash) {
                        files = with;
                    } else {
                        // Refused only where the fresh build would hide a file (a file that
                        // is also a directory): the caller builds anew then.
                        assert!(built(&with).len() < with.len(), "{path} refused");
                        continue;
                    }
                }
                let fresh = built(&files);
                assert_eq!(tree, fresh, "after {path}");
                assert_eq!(tree.len(), files.len());
            }
        }
        let mut tree = tree(&[("a/b", "1")]);
        assert!(!tree.insert(&RelPath::root(), h("1")), "the root is no file");
        assert!(!tree.insert(&RelPath::from_bytes("a//c"), h("1")), "an empty segment");
        assert!(!tree.remove(&RelPath::root()));
        assert!(tree.remove(&RelPath::from_bytes("a/b/c")), "naming nothing changes nothing");
        assert_eq!(tree.len(), 1);
    }

    #[test]
    fn diff_reports_added_modified_deleted() {
        let old = tree(&[("a", "1"), ("d/x", "1"), ("d/y", "1"), ("gone/z", "1"), ("f", "1")]);
        let new = tree(&[("a", "1"), ("d/x", "2"), ("d/y", "1"), ("new/w", "1"), ("f/inner", "1")]);
        let d = diff(&old, &new);
        let names = |v: &[(RelPath, ContentHash)]| v.iter().map(|(p, _)| p.to_string()).collect::<Vec<_>>();
        assert_eq!(names(&d.added), ["f/inner", "new/w"]);
        assert_eq!(names(&d.modified), ["d/x"]);
        assert_eq!(d.deleted.iter().map(ToString::to_string).collect::<Vec<_>>(), ["f", "gone/z"]);
    }

    #[test]
    fn diff_visits_only_mismatched_subtrees() {
        let mut files: Vec<(String, String)> = Vec::new();
        for d in 0..50 {
            for f in 0..50 {
                files.push((format!("dir{d}/file{f}"), format!("{d}-{f}")));
            }
        }
        let as_tree = |files: &[(String, String)]| {
            MerkleTree::from_files(files.iter().map(|(p, c)| (RelPath::from_bytes(p.as_str()), h(c))))
        };
        let old = as_tree(&files);
        files[1234].1 = "changed".to_owned();
        let new = as_tree(&files);
        let d = diff(&old, &new);
        assert_eq!(d.modified.len(), 1);
        // The root, its 50 directories, then the 50 files of the one changed directory.
        assert_eq!(d.visited, 1 + 50 + 50);
    }

    #[test]
    fn diff_properties_on_random_trees() {
        let mut rng = fastrand::Rng::with_seed(42);
        for _ in 0..300 {
            let old = random_tree(&mut rng);
            let new = random_tree(&mut rng);
            assert!(diff(&old, &old).is_empty(), "a tree differs from itself");
            assert_eq!(diff(&old, &old).visited, 1, "equal roots stop at once");
            let d = diff(&old, &new);
            assert_eq!(d.apply(&old), new, "applying the diff gives the new tree");
            assert_eq!(d.apply(&old).root_hash(), new.root_hash());
            assert_eq!(d.is_empty(), old.root_hash() == new.root_hash());
        }
    }
}
