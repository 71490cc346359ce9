//! Walking a workspace: which files are candidates for indexing, and why the others are not.
//!
//! Ignore rules come in tiers, highest precedence first:
//! 1. `.caretignore` files (deepest directory first), then `.cursorignore` files;
//! 2. the built-in default excludes ([`DefaultRule`]), which only the two tiers above can
//!    override with a negation (`!vendor/`);
//! 3. `.gitignore` files (deepest first), also in directories above the walked root up to the
//!    repository's top, then `.git/info/exclude`, then the global git excludes file.
//!
//! Within a tier the first file with a decisive match (ignore or negation) wins, as in git.
//! VCS directories are always excluded. Symbolic links are never followed, so the walk never
//! leaves the root and cannot loop; FIFOs, sockets and devices are never opened.

use std::fs::{self, DirEntry, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::{Error, RelPath, Result};

/// Options of a walk.
#[derive(Debug, Clone)]
pub struct WalkConfig {
    /// Files larger than this many bytes are skipped.
    pub max_file_size: u64,
    /// Apply the built-in default excludes.
    pub default_excludes: bool,
    /// The global git excludes file; [`WalkConfig::default`] finds it the way git does
    /// (`core.excludesFile`, else `$XDG_CONFIG_HOME/git/ignore`).
    pub global_excludes: Option<PathBuf>,
}

impl Default for WalkConfig {
    fn default() -> Self {
        WalkConfig {
            max_file_size: 1024 * 1024,
            default_excludes: true,
            global_excludes: ignore::gitignore::gitconfig_excludes_path(),
        }
    }
}

/// The `stat` facts the stat cache compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileStat {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Status change time, nanoseconds since the epoch.
    pub ctime_ns: i64,
    /// Inode number.
    pub ino: u64,
    /// Device number.
    pub dev: u64,
    /// Mode bits.
    pub mode: u32,
}

impl From<&Metadata> for FileStat {
    fn from(m: &Metadata) -> Self {
        FileStat {
            size: m.size(),
            mtime_ns: m.mtime().saturating_mul(1_000_000_000).saturating_add(m.mtime_nsec()),
            ctime_ns: m.ctime().saturating_mul(1_000_000_000).saturating_add(m.ctime_nsec()),
            ino: m.ino(),
            dev: m.dev(),
            mode: m.mode(),
        }
    }
}

/// A regular file the walk accepted as a candidate.
#[derive(Debug, Clone)]
pub struct WalkedFile {
    /// Path relative to the root.
    pub path: RelPath,
    /// Its `stat` at walk time.
    pub stat: FileStat,
}

/// The built-in exclusion families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DefaultRule {
    /// Version control metadata (`.git`, `.hg`, …); never overridable.
    Vcs,
    /// Third-party dependency and tool cache directories (`node_modules`, `.venv`, …).
    Vendor,
    /// A directory tagged with `CACHEDIR.TAG` (build output such as Cargo's `target`).
    CacheDir,
    /// Lock files.
    Lockfile,
    /// Minified bundles and source maps.
    Minified,
    /// Generated code, by name or by a "generated, do not edit" marker.
    Generated,
    /// Files that usually hold credentials: `.env*`, keys, certificates, credential stores.
    Sensitive,
}

/// Where a symbolic link points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkTarget {
    /// Inside the root: the target is walked at its own path.
    Inside,
    /// Outside the root.
    Outside,
    /// Dangling, or a loop.
    Broken,
}

/// Why a path was not indexed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// An ignore file matched.
    Ignored {
        /// The ignore file (relative to the root where possible).
        source: String,
        /// The matching pattern as written.
        pattern: String,
    },
    /// A built-in default exclude matched.
    Excluded {
        /// The family of the rule.
        rule: DefaultRule,
        /// The pattern or marker that matched.
        pattern: String,
    },
    /// Larger than the size cap.
    TooLarge {
        /// The file's size.
        size: u64,
        /// The cap.
        limit: u64,
    },
    /// Not text.
    Binary {
        /// How that was decided.
        detail: &'static str,
    },
    /// A symbolic link (never followed).
    Symlink {
        /// Where it points.
        target: LinkTarget,
    },
    /// A FIFO, socket or device.
    Special,
    /// Could not be read.
    Unreadable {
        /// The error.
        error: String,
    },
    /// Kept changing while it was being read.
    Changing,
}

impl SkipReason {
    /// The summary category: `ignored`, `too-large`, `binary`, `symlink` or `unreadable`.
    pub fn category(&self) -> &'static str {
        match self {
            SkipReason::Ignored { .. } | SkipReason::Excluded { .. } => "ignored",
            SkipReason::TooLarge { .. } => "too-large",
            SkipReason::Binary { .. } => "binary",
            SkipReason::Symlink { .. } => "symlink",
            SkipReason::Special | SkipReason::Unreadable { .. } | SkipReason::Changing => "unreadable",
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SkipReason::Ignored { source, pattern } => write!(f, "ignored by {source}: {pattern}"),
            SkipReason::Excluded { rule, pattern } => {
                let family = serde_json::to_value(rule).ok().and_then(|v| v.as_str().map(str::to_owned));
                write!(f, "default exclude ({}): {pattern}", family.unwrap_or_default())
            }
            SkipReason::TooLarge { size, limit } => write!(f, "too large: {size} bytes > {limit}"),
            SkipReason::Binary { detail } => write!(f, "binary: {detail}"),
            SkipReason::Symlink { target: LinkTarget::Inside } => {
                f.write_str("symlink not followed (target is inside the workspace)")
            }
            SkipReason::Symlink { target: LinkTarget::Outside } => {
                f.write_str("symlink not followed (target is outside the workspace)")
            }
            SkipReason::Symlink { target: LinkTarget::Broken } => f.write_str("symlink is dangling or loops"),
            SkipReason::Special => f.write_str("not a regular file (fifo, socket or device)"),
            SkipReason::Unreadable { error } => write!(f, "unreadable: {error}"),
            SkipReason::Changing => f.write_str("kept changing while being read"),
        }
    }
}

/// A path the walk (or a later stage) did not index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Path relative to the root.
    pub path: RelPath,
    /// Whether it is a directory (its whole subtree is skipped).
    pub is_dir: bool,
    /// Why.
    pub reason: SkipReason,
}

/// What a walk found.
#[derive(Debug, Default)]
pub struct WalkOutput {
    /// Candidate files, sorted by path.
    pub files: Vec<WalkedFile>,
    /// Skipped paths, sorted by path.
    pub skipped: Vec<Skipped>,
}

const VCS_DIRS: &[&str] = &[".git", ".hg", ".svn", ".bzr", "_darcs", ".jj", ".pijul", ".fossil"];

const DEFAULTS: &[(DefaultRule, &[&str])] = &[
    (
        DefaultRule::Vendor,
        &[
            "node_modules/",
            "bower_components/",
            "jspm_packages/",
            "vendor/",
            ".venv/",
            "venv/",
            "__pycache__/",
            ".tox/",
            ".nox/",
            ".mypy_cache/",
            ".pytest_cache/",
            ".ruff_cache/",
            ".gradle/",
            ".terraform/",
            "Pods/",
            "Carthage/",
            ".yarn/",
            ".pnpm-store/",
            ".next/",
            ".nuxt/",
            ".svelte-kit/",
            ".idea/",
            ".cache/",
            ".eggs/",
            "*.egg-info/",
            ".dart_tool/",
        ],
    ),
    (
        DefaultRule::Lockfile,
        &[
            "*.lock",
            "package-lock.json",
            "npm-shrinkwrap.json",
            "pnpm-lock.yaml",
            "go.sum",
            "bun.lockb",
            "packages.lock.json",
            "*.lockfile",
        ],
    ),
    (DefaultRule::Minified, &["*.min.js", "*.min.mjs", "*.min.css", "*-min.js", "*.map", "*.bundle.js"]),
    (
        DefaultRule::Generated,
        &[
            "*.pb.go",
            "*.pb.cc",
            "*.pb.h",
            "*_pb2.py",
            "*_pb2_grpc.py",
            "*_pb2.pyi",
            "*.g.dart",
            "*.freezed.dart",
            "*.generated.*",
            "*.Designer.cs",
            "*.designer.cs",
        ],
    ),
    (
        DefaultRule::Sensitive,
        &[
            ".env",
            ".env.*",
            "*.env",
            "*.pem",
            "*.key",
            "*.p12",
            "*.pfx",
            "*.crt",
            "*.cer",
            "*.der",
            "*.jks",
            "*.keystore",
            "*.kdbx",
            "*.ovpn",
            "id_rsa*",
            "id_dsa*",
            "id_ecdsa*",
            "id_ed25519*",
            ".npmrc",
            ".pypirc",
            ".netrc",
            "_netrc",
            ".pgpass",
            ".htpasswd",
            "*.tfstate",
            "*.tfstate.*",
            "*.tfvars",
            ".ssh/",
            ".gnupg/",
            ".aws/",
            ".docker/config.json",
            "credentials.json",
            "service-account*.json",
        ],
    ),
];

/// Extensions of formats that are never text; skipped without being opened.
const BINARY_EXTENSIONS: &[&str] = &[
    "png",
    "jpg",
    "jpeg",
    "gif",
    "bmp",
    "ico",
    "icns",
    "webp",
    "tif",
    "tiff",
    "psd",
    "heic",
    "avif",
    "pdf",
    "zip",
    "gz",
    "tgz",
    "bz2",
    "xz",
    "zst",
    "7z",
    "rar",
    "tar",
    "jar",
    "war",
    "ear",
    "whl",
    "so",
    "dylib",
    "dll",
    "exe",
    "o",
    "a",
    "lib",
    "obj",
    "class",
    "pyc",
    "pyo",
    "wasm",
    "rlib",
    "rmeta",
    "bin",
    "dat",
    "db",
    "sqlite",
    "sqlite3",
    "woff",
    "woff2",
    "ttf",
    "otf",
    "eot",
    "mp3",
    "mp4",
    "m4a",
    "wav",
    "flac",
    "ogg",
    "avi",
    "mov",
    "mkv",
    "webm",
    "iso",
    "dmg",
    "deb",
    "rpm",
    "npy",
    "npz",
    "pt",
    "pth",
    "onnx",
    "safetensors",
    "gguf",
    "parquet",
    "arrow",
    "pkl",
    "xlsx",
    "docx",
    "pptx",
    "xls",
    "doc",
    "ppt",
    "odt",
];

/// Whether a file name's extension marks a binary format.
pub fn has_binary_extension(path: &RelPath) -> bool {
    path.extension().is_some_and(|e| BINARY_EXTENSIONS.contains(&e.as_str()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Caret,
    Cursor,
    Git,
}

const IGNORE_FILES: &[(&str, Tier)] =
    &[(".caretignore", Tier::Caret), (".cursorignore", Tier::Cursor), (".gitignore", Tier::Git)];

/// Ignore files of one directory, linked to those of its ancestors.
struct Level {
    matchers: Vec<(Tier, Gitignore)>,
    parent: Option<Arc<Level>>,
}

enum Verdict {
    Skip(SkipReason),
    Keep,
}

fn decision(m: Match<&ignore::gitignore::Glob>, root: &Path) -> Option<Verdict> {
    match m {
        Match::None => None,
        Match::Whitelist(_) => Some(Verdict::Keep),
        Match::Ignore(glob) => {
            let source = glob
                .from()
                .map(|p| p.strip_prefix(root).unwrap_or(p).display().to_string())
                .unwrap_or_else(|| "an ignore rule".to_owned());
            Some(Verdict::Skip(SkipReason::Ignored { source, pattern: glob.original().to_owned() }))
        }
    }
}

impl Level {
    fn matched(&self, tier: Tier, path: &Path, is_dir: bool, root: &Path) -> Option<Verdict> {
        let mut level = Some(self);
        while let Some(l) = level {
            for (t, gi) in &l.matchers {
                if *t == tier
                    && let Some(v) = decision(gi.matched(path, is_dir), root)
                {
                    return Some(v);
                }
            }
            level = l.parent.as_deref();
        }
        None
    }
}

fn build_ignore(dir: &Path, files: &[PathBuf]) -> Gitignore {
    let mut builder = GitignoreBuilder::new(dir);
    for file in files {
        if let Some(err) = builder.add(file) {
            tracing::warn!(file = %file.display(), error = %err, "part of an ignore file could not be used");
        }
    }
    builder.build().unwrap_or_else(|err| {
        tracing::warn!(dir = %dir.display(), error = %err, "ignore rules could not be built");
        Gitignore::empty()
    })
}

fn level_for(dir: &Path, present: impl Fn(&str) -> bool, parent: Option<Arc<Level>>) -> Option<Arc<Level>> {
    let matchers: Vec<(Tier, Gitignore)> = IGNORE_FILES
        .iter()
        .filter(|(name, _)| present(name))
        .map(|(name, tier)| (*tier, build_ignore(dir, &[dir.join(name)])))
        .collect();
    if matchers.is_empty() { parent } else { Some(Arc::new(Level { matchers, parent })) }
}

struct Walker<'a> {
    root: &'a Path,
    config: &'a WalkConfig,
    defaults: Vec<(DefaultRule, Gitignore)>,
    /// `.git/info/exclude` and the global excludes, in that order.
    repo_excludes: Vec<Gitignore>,
    files: Mutex<Vec<WalkedFile>>,
    skipped: Mutex<Vec<Skipped>>,
}

/// Walks `root` and returns candidate files and skipped paths, both sorted by path.
pub fn walk(root: &Path, config: &WalkConfig) -> Result<WalkOutput> {
    let root = fs::canonicalize(root).map_err(|e| Error::io("opening workspace root", root, e))?;
    if !root.is_dir() {
        return Err(Error::NotADirectory(root));
    }
    fs::read_dir(&root).map_err(|e| Error::io("reading directory", &root, e))?;

    let defaults = if config.default_excludes {
        DEFAULTS
            .iter()
            .map(|(rule, patterns)| {
                let mut b = GitignoreBuilder::new(&root);
                for p in *patterns {
                    if let Err(err) = b.add_line(None, p) {
                        tracing::warn!(pattern = p, error = %err, "bad default exclude");
                    }
                }
                (*rule, b.build().unwrap_or_else(|_| Gitignore::empty()))
            })
            .collect()
    } else {
        Vec::new()
    };

    let (parents, repo_excludes) = repository_context(&root, config.global_excludes.as_deref());
    let walker = Walker {
        root: &root,
        config,
        defaults,
        repo_excludes,
        files: Mutex::new(Vec::new()),
        skipped: Mutex::new(Vec::new()),
    };
    rayon::scope(|scope| walker.walk_dir(scope, root.clone(), RelPath::root(), parents));

    let mut files = walker.files.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut skipped = walker.skipped.into_inner().unwrap_or_else(|p| p.into_inner());
    files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    skipped.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    Ok(WalkOutput { files, skipped })
}

/// Ignore files of the directories between the enclosing repository's top and `root`
/// (exclusive), plus `.git/info/exclude` and the global excludes file.
fn repository_context(root: &Path, global: Option<&Path>) -> (Option<Arc<Level>>, Vec<Gitignore>) {
    let top = root.ancestors().find(|dir| dir.join(".git").exists());
    let mut parents = None;
    if let Some(top) = top {
        let mut above: Vec<&Path> = root.ancestors().skip(1).take_while(|d| d.starts_with(top)).collect();
        above.reverse();
        for dir in above {
            parents = level_for(dir, |name| dir.join(name).is_file(), parents);
        }
    }
    let base = top.unwrap_or(root);
    let mut excludes = Vec::new();
    if let Some(git_dir) = top.and_then(|t| git_dir_of(&t.join(".git"))) {
        let info = git_dir.join("info").join("exclude");
        if info.is_file() {
            excludes.push(build_ignore(base, &[info]));
        }
    }
    if let Some(global) = global.filter(|p| p.is_file()) {
        excludes.push(build_ignore(base, &[global.to_path_buf()]));
    }
    (parents, excludes)
}

/// The git directory for a `.git` entry: itself, or where a `gitdir:` file points.
fn git_dir_of(dot_git: &Path) -> Option<PathBuf> {
    if dot_git.is_dir() {
        return Some(dot_git.to_path_buf());
    }
    let text = fs::read_to_string(dot_git).ok()?;
    let target = PathBuf::from(text.strip_prefix("gitdir:")?.trim());
    let dir = if target.is_absolute() { target } else { dot_git.parent()?.join(target) };
    // A linked worktree keeps shared files such as info/exclude in the common directory.
    let common = fs::read_to_string(dir.join("commondir")).ok().map(|c| dir.join(c.trim()));
    Some(common.unwrap_or(dir))
}

impl<'a> Walker<'a> {
    fn skip(&self, out: &mut Vec<Skipped>, path: RelPath, is_dir: bool, reason: SkipReason) {
        out.push(Skipped { path, is_dir, reason });
    }

    fn walk_dir<'s>(&'s self, scope: &rayon::Scope<'s>, abs: PathBuf, rel: RelPath, level: Option<Arc<Level>>) {
        let mut skipped = Vec::new();
        let entries: Vec<DirEntry> = match fs::read_dir(&abs) {
            Ok(rd) => rd
                .filter_map(|e| match e {
                    Ok(e) => Some(e),
                    Err(err) => {
                        tracing::warn!(dir = %rel, error = %err, "reading a directory entry");
                        None
                    }
                })
                .collect(),
            Err(err) => {
                self.skip(&mut skipped, rel, true, SkipReason::Unreadable { error: err.to_string() });
                self.flush(Vec::new(), skipped);
                return;
            }
        };
        let has = |name: &str| entries.iter().any(|e| e.file_name() == name);
        if !rel.is_root() && self.config.default_excludes && has("CACHEDIR.TAG") {
            let reason = SkipReason::Excluded { rule: DefaultRule::CacheDir, pattern: "CACHEDIR.TAG".to_owned() };
            self.skip(&mut skipped, rel, true, reason);
            self.flush(Vec::new(), skipped);
            return;
        }
        let level = level_for(
            &abs,
            |name| entries.iter().any(|e| e.file_name() == name && e.file_type().is_ok_and(|t| t.is_file())),
            level,
        );

        let mut files = Vec::new();
        for entry in entries {
            let name = entry.file_name();
            let child_rel = rel.join(&name);
            let child_abs = entry.path();
            let file_type = match entry.file_type() {
                Ok(t) => t,
                Err(err) => {
                    self.skip(&mut skipped, child_rel, false, SkipReason::Unreadable { error: err.to_string() });
                    continue;
                }
            };
            if file_type.is_symlink() {
                let target = match fs::canonicalize(&child_abs) {
                    Ok(t) if t.starts_with(self.root) => LinkTarget::Inside,
                    Ok(_) => LinkTarget::Outside,
                    Err(_) => LinkTarget::Broken,
                };
                self.skip(&mut skipped, child_rel, false, SkipReason::Symlink { target });
                continue;
            }
            let is_dir = file_type.is_dir();
            if is_dir && VCS_DIRS.iter().any(|v| name == *v) {
                let reason =
                    SkipReason::Excluded { rule: DefaultRule::Vcs, pattern: format!("{}/", name.to_string_lossy()) };
                self.skip(&mut skipped, child_rel, true, reason);
                continue;
            }
            if let Verdict::Skip(reason) = self.verdict(&child_abs, is_dir, level.as_deref()) {
                self.skip(&mut skipped, child_rel, is_dir, reason);
                continue;
            }
            if is_dir {
                let level = level.clone();
                scope.spawn(move |s| self.walk_dir(s, child_abs, child_rel, level));
                continue;
            }
            if !file_type.is_file() {
                self.skip(&mut skipped, child_rel, false, SkipReason::Special);
                continue;
            }
            if has_binary_extension(&child_rel) {
                self.skip(&mut skipped, child_rel, false, SkipReason::Binary { detail: "file extension" });
                continue;
            }
            match entry.metadata() {
                Ok(meta) if meta.len() > self.config.max_file_size => {
                    let reason = SkipReason::TooLarge { size: meta.len(), limit: self.config.max_file_size };
                    self.skip(&mut skipped, child_rel, false, reason);
                }
                Ok(meta) => files.push(WalkedFile { path: child_rel, stat: FileStat::from(&meta) }),
                Err(err) => {
                    self.skip(&mut skipped, child_rel, false, SkipReason::Unreadable { error: err.to_string() })
                }
            }
        }
        self.flush(files, skipped);
    }

    fn flush(&self, files: Vec<WalkedFile>, skipped: Vec<Skipped>) {
        if !files.is_empty() {
            self.files.lock().unwrap_or_else(|p| p.into_inner()).extend(files);
        }
        if !skipped.is_empty() {
            self.skipped.lock().unwrap_or_else(|p| p.into_inner()).extend(skipped);
        }
    }

    fn verdict(&self, path: &Path, is_dir: bool, level: Option<&Level>) -> Verdict {
        for tier in [Tier::Caret, Tier::Cursor] {
            if let Some(v) = level.and_then(|l| l.matched(tier, path, is_dir, self.root)) {
                return v;
            }
        }
        for (rule, gi) in &self.defaults {
            if let Match::Ignore(glob) = gi.matched(path, is_dir) {
                return Verdict::Skip(SkipReason::Excluded { rule: *rule, pattern: glob.original().to_owned() });
            }
        }
        if let Some(v) = level.and_then(|l| l.matched(Tier::Git, path, is_dir, self.root)) {
            return v;
        }
        for gi in &self.repo_excludes {
            if let Some(v) = decision(gi.matched(path, is_dir), self.root) {
                return v;
            }
        }
        Verdict::Keep
    }
}

#[cfg(test)]
mod tests;
