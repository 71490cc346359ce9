//! `caret apply FILE --edit EDIT`: write the new file an edit describes.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use caret_apply::{Format, Text};

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// The file to change (for a patch envelope: the directory its paths are relative to).
    file: PathBuf,
    /// The edit (`-`: standard input).
    #[arg(long)]
    edit: PathBuf,
    /// auto, lazy, search-replace, udiff or patch.
    #[arg(long, default_value = "auto")]
    format: String,
    /// Say what would change; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Report as JSON: path, format, changed, lines_added, lines_removed, dry_run.
    #[arg(long)]
    json: bool,
}

/// Lines added and removed between two versions (a multiset difference: cheap, and exact for
/// the counts a summary needs).
fn line_counts(old: &[String], new: &[String]) -> (usize, usize) {
    let mut counts: std::collections::HashMap<&str, isize> = std::collections::HashMap::new();
    for l in old {
        *counts.entry(l).or_default() -= 1;
    }
    for l in new {
        *counts.entry(l).or_default() += 1;
    }
    let added = counts.values().filter(|c| **c > 0).map(|c| c.unsigned_abs()).sum();
    let removed = counts.values().filter(|c| **c < 0).map(|c| c.unsigned_abs()).sum();
    (added, removed)
}

/// Writes `bytes` to `path` atomically, keeping the file's permissions.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    caret_workspace::statcache::write_atomic(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// A patch envelope: every change is worked out first; only if all apply is anything written.
fn apply_patch(args: &ApplyArgs, edit: &str) -> anyhow::Result<ExitCode> {
    let root = &args.file;
    anyhow::ensure!(root.is_dir(), "a patch envelope applies to a directory: {} is not one", root.display());
    let ops = caret_apply::patch::parse(edit)?;
    let read = |p: &str| match std::fs::read(root.join(p)) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    };
    let changes = caret_apply::patch::plan(&ops, &read).context("applying the patch (nothing was written)")?;
    let mut report = Vec::new();
    for change in &changes {
        match change {
            caret_apply::patch::Change::Write { path, bytes } => {
                if !args.dry_run {
                    write_atomically(&root.join(path), bytes)?;
                }
                report.push(serde_json::json!({"path": path, "action": "write"}));
            }
            caret_apply::patch::Change::Delete { path } => {
                if !args.dry_run {
                    std::fs::remove_file(root.join(path)).with_context(|| format!("deleting {path}"))?;
                }
                report.push(serde_json::json!({"path": path, "action": "delete"}));
            }
        }
    }
    if args.json {
        println!("{}", serde_json::json!({"format": "patch", "changes": report, "dry_run": args.dry_run}));
    } else {
        for r in &report {
            let verb = if args.dry_run { "would" } else { "did" };
            println!("{verb} {} {}", r["action"].as_str().unwrap_or(""), r["path"].as_str().unwrap_or(""));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(args: ApplyArgs) -> anyhow::Result<ExitCode> {
    let edit = if args.edit == Path::new("-") {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).context("reading the edit from standard input")?;
        s
    } else {
        std::fs::read_to_string(&args.edit).with_context(|| format!("reading the edit {}", args.edit.display()))?
    };
    let format = match args.format.as_str() {
        "auto" => None,
        name => Some(Format::parse(name)?),
    };
    if format.or_else(|| Format::detect(&edit)) == Some(Format::Patch) {
        return apply_patch(&args, &edit);
    }
    let bytes = match std::fs::read(&args.file) {
        Ok(b) => b,
        // A new file: edits that only add (an empty SEARCH, a diff from /dev/null) create it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", args.file.display())),
    };
    let text = Text::parse(&bytes).with_context(|| args.file.display().to_string())?;
    let path = args.file.to_string_lossy();
    let (new, format) = caret_apply::apply(&text, &edit, format, Some(&path))
        .with_context(|| format!("applying the edit to {}", args.file.display()))?;
    let rendered = new.render();
    let changed = rendered.as_bytes() != bytes.as_slice();
    let (added, removed) = line_counts(&text.lines, &new.lines);
    if changed && !args.dry_run {
        write_atomically(&args.file, rendered.as_bytes())?;
    }
    if args.json {
        let report = serde_json::json!({
            "path": path, "format": format.name(), "changed": changed,
            "lines_added": added, "lines_removed": removed, "dry_run": args.dry_run,
        });
        println!("{report}");
    } else {
        let verb = match (changed, args.dry_run) {
            (false, _) => "unchanged",
            (true, true) => "would change",
            (true, false) => "changed",
        };
        println!("{}: {verb} ({}): +{added} -{removed} lines", args.file.display(), format.name());
    }
    Ok(ExitCode::SUCCESS)
}
