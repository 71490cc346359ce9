//! The workspaces' trees: a base of the wanted size copied from real trees, each developer's
//! copy of it (hard links, one file varied), and the edits a sync sends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use caret_host::config::Config;

/// The comment marker for a file's language, for the line an edit appends.
pub(super) fn comment(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "py" | "sh" | "rb" | "toml" | "yaml" | "yml" | "pl" | "r" | "txt" | "cfg" | "ini" | "mk" => "#",
        "sql" | "lua" | "hs" => "--",
        "html" | "xml" | "md" | "rst" => "",
        _ => "//",
    }
}

/// Files backdated so that the scan's racy-clean guard does not re-read them on every sync.
pub(super) fn backdate(path: &Path) -> std::io::Result<()> {
    let when = std::time::SystemTime::now() - Duration::from_secs(60);
    std::fs::File::options().write(true).open(path)?.set_modified(when)
}

/// The base tree of `size` files: the trees' files in order, copied; when they hold fewer, the
/// copies again under `v<k>/`, each file with a first line naming its copy.
pub(super) fn make_base(config: &Config, trees: &[PathBuf], size: usize, base: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut sources: Vec<(PathBuf, PathBuf)> = Vec::new();
    for (t, tree) in trees.iter().enumerate() {
        let tree = std::fs::canonicalize(tree).with_context(|| format!("opening {}", tree.display()))?;
        let walked = caret_workspace::walk::walk(&tree, &config.walk_config())
            .with_context(|| format!("walking {}", tree.display()))?;
        for f in walked.files {
            if f.stat.size == 0 || f.stat.size > 256 * 1024 {
                continue;
            }
            let from = f.path.under(&tree);
            let rel = from.strip_prefix(&tree).unwrap_or(&from).to_path_buf();
            sources.push((from, PathBuf::from(format!("t{t}")).join(rel)));
        }
    }
    anyhow::ensure!(!sources.is_empty(), "no files in {trees:?}");
    let mut made = Vec::with_capacity(size);
    for i in 0..size {
        let (from, rel) = &sources[i % sources.len()];
        let round = i / sources.len();
        let rel = if round == 0 { rel.clone() } else { PathBuf::from(format!("v{round}")).join(rel) };
        let to = base.join(&rel);
        std::fs::create_dir_all(to.parent().unwrap_or(base))?;
        if round == 0 {
            std::fs::copy(from, &to)?;
        } else {
            let text = std::fs::read(from)?;
            let mut varied = format!("{} copy {round}\n", comment(&rel)).into_bytes();
            varied.extend_from_slice(&text);
            std::fs::write(&to, varied)?;
        }
        backdate(&to)?;
        made.push(rel);
    }
    Ok(made)
}

/// A developer's copy of the base: every file hard-linked, one replaced by a varied copy.
pub(super) fn copy_base(base: &Path, files: &[PathBuf], dir: &Path, n: usize) -> anyhow::Result<()> {
    for rel in files {
        let to = dir.join(rel);
        std::fs::create_dir_all(to.parent().unwrap_or(dir))?;
        std::fs::hard_link(base.join(rel), &to)?;
    }
    edit(dir, &files[n % files.len()], &format!("workspace {n}"))
}

/// Replaces a file (breaking its hard link) with its text plus a line naming `what`.
pub(super) fn edit(dir: &Path, rel: &Path, what: &str) -> anyhow::Result<()> {
    let path = dir.join(rel);
    let mut text = std::fs::read(&path)?;
    if let Some(cut) = text.windows(17).position(|w| w == b" caret-capacity: ") {
        let start = text[..cut].iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
        text.truncate(start);
    }
    if !text.ends_with(b"\n") {
        text.push(b'\n');
    }
    text.extend_from_slice(format!("{} caret-capacity: {what}\n", comment(rel)).as_bytes());
    let tmp = path.with_extension("caret-tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(())
}
