//! Reading the workspace: `read_file`, `list_dir`, `glob`. File work runs on the blocking
//! pool, so concurrent calls really run side by side.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::PathBuf;

use serde_json::{Value, json};

use super::{Ctx, Spec, Tool, ToolError, ToolResult, blocking, io, string_arg, truncate, usize_arg};

/// Lines a `read_file` without a range shows.
pub const READ_LINES: usize = 400;
/// Files larger than this are read only in the range asked for.
const READ_BYTES_WHOLE: u64 = 8 << 20;

/// `read_file`: a file's lines, numbered; a range of a large one.
pub struct ReadFile {
    spec: Spec,
}

impl ReadFile {
    /// The tool.
    pub fn new() -> ReadFile {
        ReadFile {
            spec: Spec {
                name: "read_file",
                description: "Read a file of the workspace. Lines come numbered (`  12| text`). Without a range \
                              the first 400 lines; give start_line/end_line (1-based, inclusive) for others. \
                              Read several files in one turn by calling this tool several times at once.",
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "Workspace-relative path"},
                        "start_line": {"type": "integer", "minimum": 1},
                        "end_line": {"type": "integer", "minimum": 1}
                    },
                    "required": ["path"]
                }),
                read_only: true,
            },
        }
    }
}

impl Default for ReadFile {
    fn default() -> Self {
        ReadFile::new()
    }
}

#[async_trait::async_trait]
impl Tool for ReadFile {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let rel = string_arg(&args, "path")?.to_owned();
        let path = ctx.resolve(&rel)?;
        let start = usize_arg(&args, "start_line")?.unwrap_or(1).max(1);
        let end = usize_arg(&args, "end_line")?;
        if end.is_some_and(|e| e < start) {
            return Err(ToolError::new("end_line is before start_line"));
        }
        let max = ctx.max_output_bytes;
        let seen = path.clone();
        let text = blocking(move || read_lines(&path, &rel, start, end, max)).await?;
        ctx.saw(&seen);
        Ok(text)
    }
}

fn read_lines(path: &PathBuf, rel: &str, start: usize, end: Option<usize>, max: usize) -> ToolResult {
    let meta = std::fs::metadata(path).map_err(|e| io(rel, e))?;
    if meta.is_dir() {
        return Err(ToolError::new(format!("{rel} is a directory (use list_dir)")));
    }
    let file = std::fs::File::open(path).map_err(|e| io(rel, e))?;
    // Large files are read only up to the end of the range asked for (and never whole).
    let mut bytes = Vec::new();
    let limit = if meta.len() > READ_BYTES_WHOLE { READ_BYTES_WHOLE } else { meta.len() + 1 };
    file.take(limit).read_to_end(&mut bytes).map_err(|e| io(rel, e))?;
    if bytes.iter().take(8192).any(|&b| b == 0) {
        return Err(ToolError::new(format!("{rel} is a binary file ({} bytes): not shown", meta.len())));
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let partial = meta.len() > READ_BYTES_WHOLE;
    let total = lines.len();
    let last = end.unwrap_or(start + READ_LINES - 1).min(total);
    if start > total.max(1) {
        return Err(ToolError::new(format!("{rel} has {total} lines; start_line {start} is past its end")));
    }
    let width = last.to_string().len();
    let mut out = String::new();
    for (n, line) in lines.iter().enumerate().take(last).skip(start - 1) {
        let _ = writeln!(out, "{:>width$}| {line}", n + 1);
    }
    if end.is_none() && last < total {
        let _ = writeln!(out, "[lines {start}-{last} of {total}; read on with start_line={}]", last + 1);
    }
    if partial && last >= total {
        let _ = writeln!(out, "[the file is {} bytes; only its first {READ_BYTES_WHOLE} were read]", meta.len());
    }
    Ok(truncate(out, max, "ask for a smaller line range"))
}

/// Entries `list_dir` shows at most.
const LIST_MAX: usize = 500;

/// `list_dir`: a directory's entries.
pub struct ListDir {
    spec: Spec,
}

impl ListDir {
    /// The tool.
    pub fn new() -> ListDir {
        ListDir {
            spec: Spec {
                name: "list_dir",
                description: "List a directory of the workspace (default: its root): subdirectories end with `/`, \
                              files show their size. Ignored files (.gitignore, .caretignore) are left out.",
                parameters: json!({
                    "type": "object",
                    "properties": {"path": {"type": "string", "description": "Workspace-relative directory"}}
                }),
                read_only: true,
            },
        }
    }
}

impl Default for ListDir {
    fn default() -> Self {
        ListDir::new()
    }
}

#[async_trait::async_trait]
impl Tool for ListDir {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let rel = args.get("path").and_then(Value::as_str).unwrap_or(".").to_owned();
        let dir = ctx.resolve(&rel)?;
        let ctx = ctx.clone();
        blocking(move || {
            if !dir.is_dir() {
                return Err(ToolError::new(format!("{rel} is not a directory")));
            }
            let mut entries: Vec<(bool, String, u64)> = walker(&dir)
                .max_depth(Some(1))
                .build()
                .filter_map(Result::ok)
                .filter(|e| e.depth() == 1)
                .map(|e| {
                    let is_dir = e.file_type().is_some_and(|t| t.is_dir());
                    let size = if is_dir { 0 } else { e.metadata().map_or(0, |m| m.len()) };
                    (is_dir, e.file_name().to_string_lossy().into_owned(), size)
                })
                .collect();
            entries.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            let total = entries.len();
            let mut out = String::new();
            for (is_dir, name, size) in entries.iter().take(LIST_MAX) {
                if *is_dir {
                    let _ = writeln!(out, "{name}/");
                } else {
                    let _ = writeln!(out, "{name}  ({size} bytes)");
                }
            }
            if total > LIST_MAX {
                let _ = writeln!(out, "[{} more entries not shown; use glob to narrow]", total - LIST_MAX);
            }
            if total == 0 {
                out.push_str("(empty)\n");
            }
            Ok(truncate(out, ctx.max_output_bytes, "list a subdirectory"))
        })
        .await
    }
}

/// A walk of the workspace honouring `.gitignore`, `.cursorignore` and `.caretignore`
/// (also outside a git repository), hidden files included but `.git` left out.
pub(crate) fn walker(from: &std::path::Path) -> ignore::WalkBuilder {
    let mut b = ignore::WalkBuilder::new(from);
    b.hidden(false)
        .require_git(false)
        .add_custom_ignore_filename(".cursorignore")
        .add_custom_ignore_filename(".caretignore")
        .filter_entry(|e| e.file_name() != ".git");
    b
}

/// The workspace's layout for the system prompt: its files and directories two levels deep
/// (ignore rules honoured, sorted), at most `max` lines, with a note when more exist.
pub fn overview(root: &std::path::Path, max: usize) -> String {
    let mut paths: Vec<String> = walker(root)
        .max_depth(Some(2))
        .build()
        .flatten()
        .filter(|e| e.depth() > 0)
        .map(|e| {
            let rel = e.path().strip_prefix(root).unwrap_or(e.path()).to_string_lossy().replace('\\', "/");
            if e.file_type().is_some_and(|t| t.is_dir()) { format!("{rel}/") } else { rel }
        })
        .collect();
    paths.sort();
    let more = paths.len().saturating_sub(max);
    paths.truncate(max);
    let mut text = paths.join("\n");
    if more > 0 {
        text.push_str(&format!("\n… and {more} more (list_dir and glob show them)"));
    }
    text
}

/// Paths `glob` returns at most.
const GLOB_MAX: usize = 200;

/// `glob`: workspace files whose paths match a pattern.
pub struct Glob {
    spec: Spec,
}

impl Glob {
    /// The tool.
    pub fn new() -> Glob {
        Glob {
            spec: Spec {
                name: "glob",
                description: "Find files by path pattern (`**/*.rs`, `src/**/test_*.py`), relative to the workspace \
                              root; ignored files are left out. Paths come sorted.",
                parameters: json!({
                    "type": "object",
                    "properties": {"pattern": {"type": "string"}},
                    "required": ["pattern"]
                }),
                read_only: true,
            },
        }
    }
}

impl Default for Glob {
    fn default() -> Self {
        Glob::new()
    }
}

#[async_trait::async_trait]
impl Tool for Glob {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let pattern = string_arg(&args, "pattern")?.to_owned();
        let matcher = globset::GlobBuilder::new(pattern.trim_start_matches("./"))
            .literal_separator(true)
            .build()
            .map_err(|e| ToolError::new(format!("bad pattern: {e}")))?
            .compile_matcher();
        let ctx = ctx.clone();
        blocking(move || {
            let mut found: Vec<String> = walker(&ctx.root)
                .build()
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
                .map(|e| ctx.relative(e.path()))
                .filter(|rel| matcher.is_match(rel))
                .collect();
            found.sort();
            let total = found.len();
            let mut out: String = found.iter().take(GLOB_MAX).map(|p| format!("{p}\n")).collect();
            if total > GLOB_MAX {
                let _ = writeln!(out, "[{} more paths not shown; narrow the pattern]", total - GLOB_MAX);
            }
            if total == 0 {
                let _ = writeln!(out, "no files match {pattern}");
            }
            Ok(truncate(out, ctx.max_output_bytes, "narrow the pattern"))
        })
        .await
    }
}
