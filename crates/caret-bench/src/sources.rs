//! The projects the search question sets are asked of: each set names its source (a package on
//! a registry — a crate, an npm package, a PyPI source distribution, or a Debian source
//! package's upstream archive — its
//! SHA-256, and the folder inside it that is the tree), and this fetches it once into
//! `$CARET_HOME/bench/sources/`, checks the digest and unpacks it with `tar` (gzip and xz).
//! Each registry's address can be replaced by a mirror's (`CARET_CRATES_URL`, `CARET_NPM_URL`,
//! `CARET_DEBIAN_URL`; PyPI's is `CARET_PYPI_URL`, as for models).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use serde::Deserialize;

/// Where a question set's project comes from.
#[derive(Debug, Clone, Deserialize)]
pub struct Source {
    /// `crates`, `npm`, `pypi` (a source distribution) or `debian`.
    pub registry: String,
    /// The package (a Debian *source* package's name for `debian`).
    pub package: String,
    /// Its version.
    pub version: String,
    /// The archive's file name where the registry's layout does not imply it (Debian's
    /// `NAME_VERSION.orig.tar.xz`).
    #[serde(default)]
    pub file: Option<String>,
    /// The archive's SHA-256 (hex).
    pub sha256: String,
    /// The folder inside the archive that is indexed (answers are relative to it).
    pub root: String,
}

impl Source {
    /// The archive's address on its registry (or the mirror named in the environment).
    pub fn url(&self) -> anyhow::Result<String> {
        let base = |var: &str, default: &str| std::env::var(var).unwrap_or_else(|_| default.to_owned());
        let (p, v) = (&self.package, &self.version);
        Ok(match self.registry.as_str() {
            "crates" => format!("{}/crates/{p}/{p}-{v}.crate", base("CARET_CRATES_URL", "https://static.crates.io")),
            "npm" => {
                let short = p.rsplit('/').next().unwrap_or(p);
                format!("{}/{p}/-/{short}-{v}.tgz", base("CARET_NPM_URL", "https://registry.npmjs.org"))
            }
            // Resolved through the index's JSON API: see `fetch`.
            "pypi" => anyhow::bail!("a PyPI file's address comes from the index"),
            "debian" => {
                let file = self.file.as_deref().context("a Debian source names its archive (`file`)")?;
                // The pool's folder: the first letter, or `libX` for `lib…` packages.
                let letter = if p.starts_with("lib") { &p[..p.len().min(4)] } else { &p[..1] };
                format!("{}/pool/main/{letter}/{p}/{file}", base("CARET_DEBIAN_URL", "https://deb.debian.org/debian"))
            }
            other => anyhow::bail!("unknown registry {other:?}: crates, npm, pypi or debian"),
        })
    }
}

/// The tree of `source`, fetched and unpacked under `dir` (named `name`) unless it is there.
pub fn fetch(dir: &Path, name: &str, source: &Source, index: &caret_weights::Models) -> anyhow::Result<PathBuf> {
    anyhow::ensure!(
        !name.contains(['/', '\\']) && !name.starts_with('.') && !source.root.split('/').any(|p| p == ".."),
        "a question set's name and root stay inside the sources folder: {name:?}, {:?}",
        source.root
    );
    let unpacked = dir.join(name);
    let done = unpacked.join(".caret-unpacked");
    let root = unpacked.join(&source.root);
    if done.exists() {
        return Ok(root);
    }
    let downloads = dir.join(".downloads");
    std::fs::create_dir_all(&downloads).with_context(|| format!("creating {}", downloads.display()))?;
    let rt = caret_host::runtime::runtime()?;
    let url = match (source.registry.as_str(), &source.file) {
        ("pypi", Some(file)) => rt.block_on(index.resolve(&source.package, &source.version, file))?,
        _ => source.url()?,
    };
    let file = url.rsplit('/').next().filter(|f| !f.is_empty() && !f.starts_with('.')).unwrap_or("archive");
    let archive = downloads.join(file);
    println!("fetching {} {} ({}) …", source.package, source.version, source.registry);
    rt.block_on(caret_weights::fetch_verified(&url, &archive, &source.sha256, &|_, _| {}))
        .with_context(|| format!("fetching {url}"))?;
    let staging = dir.join(format!(".{name}.staging"));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    // GNU tar reads gzip and xz by the content; `.crate` files are gzipped tarballs.
    let out = Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&staging)
        .output()
        .context("running tar (the sources are unpacked with the system's tar and xz)")?;
    anyhow::ensure!(
        out.status.success(),
        "unpacking {}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    anyhow::ensure!(staging.join(&source.root).is_dir(), "{url} has no folder {}", source.root);
    std::fs::write(staging.join(".caret-unpacked"), &source.sha256)?;
    let _ = std::fs::remove_dir_all(&unpacked);
    std::fs::rename(&staging, &unpacked)?;
    let _ = std::fs::remove_file(&archive);
    Ok(root)
}
