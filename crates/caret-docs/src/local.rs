//! A folder of documentation as a source: its HTML (main content, as a crawled page's),
//! Markdown and reStructuredText files, each a page whose URL is its `file://` URL. Hidden
//! files and directories are skipped, and so are files over the size cap. Pages whose
//! Markdown did not change are not written again; files that went away leave the source.

use std::path::Path;

use crate::crawl::Recorder;
use crate::extract;
use crate::pages::{Counts, SourceDir};
use crate::{Error, Result};

/// Largest file read.
const MAX_BYTES: u64 = 5 << 20;

/// Reads the folder `root` into `dir`, telling `progress` the counts as they change.
pub fn import(
    dir: &SourceDir,
    root: &Path,
    progress: &mut dyn FnMut(&Counts) -> std::ops::ControlFlow<()>,
) -> Result<Counts> {
    let root = std::fs::canonicalize(root).map_err(|e| Error::io(root, e))?;
    if !root.is_dir() {
        return Err(Error::BadRequest(format!("{} is not a folder", root.display())));
    }
    let prefix = url::Url::from_directory_path(&root)
        .map_err(|()| Error::BadRequest(format!("{} has no file URL", root.display())))?
        .to_string();
    let mut rec = Recorder::open(dir, &prefix)?;
    let mut files = Vec::new();
    collect(&root, &mut files);
    files.sort();
    for path in files {
        let Ok(url) = url::Url::from_file_path(&path) else { continue };
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if size > MAX_BYTES {
            *rec.counts.skipped.entry("over the size limit".into()).or_default() += 1;
            continue;
        }
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                *rec.counts.failed.entry(format!("unreadable: {}", e.kind())).or_default() += 1;
                continue;
            }
        };
        if bytes[..bytes.len().min(1024)].contains(&0) {
            *rec.counts.skipped.entry("binary content".into()).or_default() += 1;
            continue;
        }
        let text = String::from_utf8_lossy(&bytes);
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_owned();
        let page = match ext.as_str() {
            "html" | "htm" | "xhtml" if extract::nesting(&text) > extract::MAX_OPEN => {
                *rec.counts.skipped.entry("nested too deeply".into()).or_default() += 1;
                continue;
            }
            "html" | "htm" | "xhtml" => extract::html(&text, &url),
            "md" | "markdown" | "mdx" => extract::markdown(&text, &url, &name),
            "rst" | "txt" => extract::markdown(&extract::rst_to_markdown(&text), &url, &name),
            _ => continue,
        };
        rec.counts.found += 1;
        rec.counts.fetched += 1;
        rec.record(url.as_str(), 0, &page, Vec::new(), None, None)?;
        if progress(&rec.counts).is_break() {
            rec.stop()?;
            return Err(Error::Stopped);
        }
        rec.save_now_and_then()?;
    }
    rec.finish()
}

/// Every non-hidden file below `dir`.
fn collect(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            collect(&e.path(), out);
        } else if kind.is_file() {
            out.push(e.path());
        }
    }
}
