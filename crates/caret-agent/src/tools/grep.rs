//! `grep`: a regular expression over the workspace's files, with ripgrep's own crates
//! (`grep-regex`, `grep-searcher`: binary files skipped, lines found without loading whole
//! files) and ignore rules (`ignore`).

use std::fmt::Write as _;

use grep_regex::RegexMatcherBuilder;
use grep_searcher::sinks::UTF8;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use serde_json::{Value, json};

use super::fs::walker;
use super::{Ctx, Spec, Tool, ToolError, ToolResult, blocking, string_arg, truncate, usize_arg};

/// Matching lines shown by default.
const MATCHES: usize = 100;
/// Characters of a matching line shown.
const LINE_CHARS: usize = 300;

/// `grep`.
pub struct Grep {
    spec: Spec,
}

impl Grep {
    /// The tool.
    pub fn new() -> Grep {
        Grep {
            spec: Spec {
                name: "grep",
                description: "Search file contents with a regular expression (Rust regex syntax). Answers \
                              `path:line: text`, in path order. Narrow with `path` (a file or directory) and \
                              `glob` (`*.py`). For questions about meaning rather than exact text, use \
                              codebase_search.",
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "pattern": {"type": "string"},
                        "path": {"type": "string", "description": "File or directory (default: the workspace)"},
                        "glob": {"type": "string", "description": "Only files whose name matches, e.g. *.rs"},
                        "case_insensitive": {"type": "boolean"},
                        "max_matches": {"type": "integer", "minimum": 1}
                    },
                    "required": ["pattern"]
                }),
                read_only: true,
            },
        }
    }
}

impl Default for Grep {
    fn default() -> Self {
        Grep::new()
    }
}

#[async_trait::async_trait]
impl Tool for Grep {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let pattern = string_arg(&args, "pattern")?.to_owned();
        let from = ctx.resolve(args.get("path").and_then(Value::as_str).unwrap_or("."))?;
        let max = usize_arg(&args, "max_matches")?.unwrap_or(MATCHES).clamp(1, 1000);
        let matcher = RegexMatcherBuilder::new()
            .case_insensitive(args.get("case_insensitive").and_then(Value::as_bool).unwrap_or(false))
            .build(&pattern)
            .map_err(|e| ToolError::new(format!("bad pattern: {e}")))?;
        let name_filter = match args.get("glob").and_then(Value::as_str) {
            Some(g) => {
                Some(globset::Glob::new(g).map_err(|e| ToolError::new(format!("bad glob: {e}")))?.compile_matcher())
            }
            None => None,
        };
        let ctx = ctx.clone();
        blocking(move || {
            let mut searcher =
                SearcherBuilder::new().binary_detection(BinaryDetection::quit(0)).line_number(true).build();
            let mut files: Vec<std::path::PathBuf> = walker(&from)
                .build()
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
                .filter(|e| name_filter.as_ref().is_none_or(|m| m.is_match(e.file_name())))
                .map(ignore::DirEntry::into_path)
                .collect();
            files.sort();
            let (mut out, mut shown, mut more) = (String::new(), 0usize, 0usize);
            for path in &files {
                let rel = ctx.relative(path);
                let result = searcher.search_path(
                    &matcher,
                    path,
                    UTF8(|line_no, line| {
                        if shown < max {
                            let line = line.trim_end_matches(['\n', '\r']);
                            let cut: String = line.chars().take(LINE_CHARS).collect();
                            let ellipsis = if cut.len() < line.len() { " …" } else { "" };
                            let _ = writeln!(out, "{rel}:{line_no}: {cut}{ellipsis}");
                            shown += 1;
                        } else {
                            more += 1;
                        }
                        Ok(true)
                    }),
                );
                // Unreadable files (permissions, vanished) are skipped, as ripgrep does.
                let _ = result;
            }
            if more > 0 {
                let _ = writeln!(out, "[{more} more matching lines not shown; narrow with path or glob]");
            }
            if shown == 0 {
                let _ = writeln!(out, "no matches for {pattern}");
            }
            Ok(truncate(out, ctx.max_output_bytes, "narrow with path or glob"))
        })
        .await
    }
}
