//! `caret apply FILE --edit EDIT`: write the new file an edit describes.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use caret_apply::{Format, Text};

use caret_host::backend::Backend;
use caret_host::config::Config;
use caret_host::runtime::runtime;

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
    /// Report as JSON: path, format, method, changed, lines_added, lines_removed, dry_run (and,
    /// for a model merge, the model, region and token counts).
    #[arg(long)]
    json: bool,
    /// When a model merges a lazy snippet: auto (when the matcher cannot place it and a model
    /// is configured), always, never.
    #[arg(long, default_value = "auto")]
    merge: String,
    /// The model alias that merges (default: `apply`, else the first configured).
    #[arg(long, env = "CARET_APPLY_MODEL")]
    model: Option<String>,
    /// Merge with this server's gateway instead of the embedded one (env CARET_SERVER).
    #[arg(long, env = "CARET_SERVER")]
    server: Option<String>,
    /// API token for --server (env CARET_TOKEN).
    #[arg(long, env = "CARET_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// When a model merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MergeMode {
    Auto,
    Always,
    Never,
}

/// How the new file came about.
struct Applied {
    text: Text,
    format: Format,
    /// The model merge's facts, when a model merged.
    merged: Option<serde_json::Value>,
}

/// A model merges a lazy snippet into the file.
fn model_merge(
    config: &Config,
    args: &ApplyArgs,
    text: &Text,
    edit: &str,
    path: &str,
    why: Option<&caret_apply::Error>,
) -> anyhow::Result<Applied> {
    let connected = Backend::connect(
        config,
        args.server.as_deref(),
        args.token.as_deref(),
        args.model.as_deref(),
        &["apply"],
        "apply",
    )?;
    let Some((backend, model)) = connected else {
        let why = why.map(|e| format!("{e}\n")).unwrap_or_default();
        anyhow::bail!(
            "{why}no model is configured to merge the edit: add [[models]] to the config (an `apply` alias is used \
             first), or use --server"
        );
    };
    let plan = caret_apply::merge::plan(text, edit, Some(path))?;
    let rt = runtime()?;
    let answer = rt
        .block_on(async {
            let started = std::time::Instant::now();
            let stream = backend.chat(plan.request(&model, true)).await?;
            caret_host::merge::collect(stream, started).await
        })
        .with_context(|| format!("merging the edit with model {model}"))?;
    let merged = caret_apply::merge::splice(text, &plan, &answer.text)
        .with_context(|| format!("the answer of model {model}"))?;
    let usage = answer.usage.unwrap_or_default();
    let details = usage.completion_tokens_details.unwrap_or_default();
    let facts = serde_json::json!({
        "model": model,
        "reason": why.map(ToString::to_string),
        "region": [plan.start + 1, plan.end],
        "generated_tokens": usage.completion_tokens,
        "accepted_prediction_tokens": details.accepted_prediction_tokens,
        "rejected_prediction_tokens": details.rejected_prediction_tokens,
        "ms": u64::try_from(answer.total.as_millis()).unwrap_or(u64::MAX),
    });
    Ok(Applied { text: merged, format: Format::Lazy, merged: Some(facts) })
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

pub fn run(config: &Config, args: ApplyArgs) -> anyhow::Result<ExitCode> {
    let edit = if args.edit == Path::new("-") {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).context("reading the edit from standard input")?;
        s
    } else {
        std::fs::read_to_string(&args.edit).with_context(|| format!("reading the edit {}", args.edit.display()))?
    };
    let mode = match args.merge.as_str() {
        "auto" => MergeMode::Auto,
        "always" => MergeMode::Always,
        "never" => MergeMode::Never,
        other => anyhow::bail!("--merge is auto, always or never, not {other:?}"),
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
    let lazy = format.or_else(|| Format::detect(&edit)) == Some(Format::Lazy);
    let applied = if lazy && mode == MergeMode::Always {
        model_merge(config, &args, &text, &edit, &path, None)?
    } else {
        match caret_apply::apply(&text, &edit, format, Some(&path)) {
            Ok((text, format)) => Applied { text, format, merged: None },
            Err(e) if e.is_unplaced() && lazy && mode == MergeMode::Auto => {
                model_merge(config, &args, &text, &edit, &path, Some(&e))
                    .with_context(|| format!("applying the edit to {}", args.file.display()))?
            }
            Err(e) => return Err(e).with_context(|| format!("applying the edit to {}", args.file.display())),
        }
    };
    let (new, format) = (applied.text, applied.format);
    let rendered = new.render();
    let changed = rendered.as_bytes() != bytes.as_slice();
    let (added, removed) = caret_apply::line_counts(&text.lines, &new.lines);
    if changed && !args.dry_run {
        write_atomically(&args.file, rendered.as_bytes())?;
    }
    if args.json {
        let method = if applied.merged.is_some() { "model" } else { "matcher" };
        let mut report = serde_json::json!({
            "path": path, "format": format.name(), "method": method, "changed": changed,
            "lines_added": added, "lines_removed": removed, "dry_run": args.dry_run,
        });
        if let Some(m) = applied.merged {
            report["merge"] = m;
        }
        println!("{report}");
    } else {
        let verb = match (changed, args.dry_run) {
            (false, _) => "unchanged",
            (true, true) => "would change",
            (true, false) => "changed",
        };
        let how = match &applied.merged {
            Some(m) => format!(
                "lazy, merged by model {} in {} ms, {} of {} tokens from the draft",
                m["model"].as_str().unwrap_or("?"),
                m["ms"],
                m["accepted_prediction_tokens"],
                m["generated_tokens"]
            ),
            None => format.name().to_owned(),
        };
        println!("{}: {verb} ({how}): +{added} -{removed} lines", args.file.display());
    }
    Ok(ExitCode::SUCCESS)
}
