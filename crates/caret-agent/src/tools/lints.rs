//! `read_lints`: diagnostics from the project's own linters, found from its files, run in the
//! sandbox and parsed into `path:line:column: severity: message [code]`.
//!
//! | project file | linter | output read |
//! |---|---|---|
//! | `Cargo.toml` | `cargo clippy --all-targets` (`cargo check` without clippy) | JSON messages |
//! | `pyproject.toml`, `ruff.toml`, `setup.py`, `requirements.txt`, `*.py` at the root | `ruff check` (without ruff: a syntax check by `python3`) | JSON |
//! | `package.json` with `node_modules/.bin/eslint` | `eslint` | JSON |
//! | `tsconfig.json` | `tsc --noEmit` (the project's, else one on `PATH`) | `file(line,col): error TSnnnn: …` |
//! | `go.mod` | `go vet ./...` | `file:line:col: …` |
//!
//! Builds run offline (`CARGO_NET_OFFLINE`): a lint never waits on the network; missing
//! dependencies show up as the linter's own error, which the model reads.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use caret_sandbox::{Output, Sandbox, Spec as Command};
use serde_json::{Value, json};

use super::{Ctx, Spec, Tool, ToolError, ToolResult, truncate};

/// How bad a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Does not build, or fails the linter's error rules.
    Error,
    /// A warning.
    Warning,
    /// A note or hint.
    Info,
}

impl Severity {
    fn name(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// One finding of a linter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Workspace-relative path.
    pub path: String,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
    /// How bad.
    pub severity: Severity,
    /// What is wrong.
    pub message: String,
    /// The rule or error code (`unused_variables`, `F401`, `TS2322`), when there is one.
    pub code: Option<String>,
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}: {}: {}", self.path, self.line, self.column, self.severity.name(), self.message)?;
        match &self.code {
            Some(c) => write!(f, " [{c}]"),
            None => Ok(()),
        }
    }
}

/// A linter this tool knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linter {
    /// `cargo clippy`, or `cargo check`.
    Cargo,
    /// `ruff check`, or a `python3` syntax check.
    Python,
    /// The project's eslint.
    Eslint,
    /// The TypeScript compiler.
    Tsc,
    /// `go vet`.
    GoVet,
}

/// A `python3` syntax check of the workspace's `.py` files (outside hidden and vendored
/// directories) for projects without ruff: `path:line:col: message`. Nothing is written.
const PY_SYNTAX: &str = r#"import ast, os, sys
for d, dirs, files in os.walk("."):
    dirs[:] = [x for x in dirs if not x.startswith(".") and x not in ("node_modules", "venv", "__pycache__")]
    for f in files:
        if f.endswith(".py"):
            p = os.path.join(d, f)[2:]
            try:
                ast.parse(open(p, "rb").read(), p)
            except SyntaxError as e:
                print(f"{p}:{e.lineno or 1}:{e.offset or 1}: {e.msg}")
"#;

impl Linter {
    /// The linters a project at `root` uses, from its files.
    pub fn detect(root: &Path) -> Vec<Linter> {
        let has = |f: &str| root.join(f).exists();
        let mut found = Vec::new();
        if has("Cargo.toml") {
            found.push(Linter::Cargo);
        }
        let py_root = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "py") && e.file_type().is_ok_and(|t| t.is_file()));
        if ["pyproject.toml", "ruff.toml", ".ruff.toml", "setup.py", "setup.cfg", "requirements.txt"]
            .iter()
            .any(|f| has(f))
            || py_root
        {
            found.push(Linter::Python);
        }
        if has("package.json") && has("node_modules/.bin/eslint") {
            found.push(Linter::Eslint);
        }
        if has("tsconfig.json") {
            found.push(Linter::Tsc);
        }
        if has("go.mod") {
            found.push(Linter::GoVet);
        }
        found
    }

    /// Its name in the answer.
    pub fn name(self) -> &'static str {
        match self {
            Linter::Cargo => "cargo",
            Linter::Python => "ruff",
            Linter::Eslint => "eslint",
            Linter::Tsc => "tsc",
            Linter::GoVet => "go vet",
        }
    }

    /// The shell command, run at the workspace root. Each prints a `#linter: NAME` line first
    /// on stderr saying which variant ran.
    fn command(self) -> String {
        match self {
            Linter::Cargo => "if cargo clippy --version >/dev/null 2>&1; then echo '#linter: cargo clippy' >&2; \
                              cargo clippy --all-targets --message-format=json --quiet; \
                              else echo '#linter: cargo check' >&2; \
                              cargo check --all-targets --message-format=json --quiet; fi"
                .to_owned(),
            Linter::Python => format!(
                "if command -v ruff >/dev/null 2>&1; then echo '#linter: ruff' >&2; \
                 ruff check --output-format=json --exit-zero --no-cache .; \
                 elif python3 -m ruff --version >/dev/null 2>&1; then echo '#linter: ruff' >&2; \
                 python3 -m ruff check --output-format=json --exit-zero --no-cache .; \
                 else echo '#linter: python3 syntax check (ruff is not installed)' >&2; \
                 python3 -B -c '{}'; fi",
                PY_SYNTAX.replace('\'', "'\\''")
            ),
            Linter::Eslint => "echo '#linter: eslint' >&2; node_modules/.bin/eslint -f json .".to_owned(),
            Linter::Tsc => "echo '#linter: tsc' >&2; if [ -x node_modules/.bin/tsc ]; then \
                            node_modules/.bin/tsc --noEmit --pretty false; else tsc --noEmit --pretty false; fi"
                .to_owned(),
            Linter::GoVet => "echo '#linter: go vet' >&2; go vet ./... 2>&1".to_owned(),
        }
    }

    /// The diagnostics in a run's output; paths made workspace-relative.
    pub fn parse(self, out: &Output, ctx: &Ctx) -> Vec<Diagnostic> {
        let rel = |p: &str| {
            let p = Path::new(p);
            if p.is_absolute() { ctx.relative(p) } else { p.to_string_lossy().trim_start_matches("./").to_owned() }
        };
        match self {
            Linter::Cargo => parse_cargo(&out.stdout, &rel),
            Linter::Python if out.stdout.trim_start().starts_with('[') => parse_ruff(&out.stdout, &rel),
            Linter::Python => parse_colon_lines(&out.stdout, Severity::Error, &rel),
            Linter::Eslint => parse_eslint(&out.stdout, &rel),
            Linter::Tsc => parse_tsc(&out.stdout, &rel),
            Linter::GoVet => parse_colon_lines(&out.stdout, Severity::Error, &rel),
        }
    }
}

fn u32_of(v: &Value) -> u32 {
    v.as_u64().and_then(|n| u32::try_from(n).ok()).unwrap_or(1)
}

/// Cargo's `--message-format=json` lines: compiler messages with a primary span.
pub fn parse_cargo(stdout: &str, rel: &dyn Fn(&str) -> String) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for line in stdout.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
        if v["reason"] != "compiler-message" {
            continue;
        }
        let m = &v["message"];
        let severity = match m["level"].as_str() {
            Some("error" | "error: internal compiler error") => Severity::Error,
            Some("warning") => Severity::Warning,
            _ => Severity::Info,
        };
        let Some(span) = m["spans"].as_array().and_then(|s| s.iter().find(|s| s["is_primary"] == true)) else {
            continue;
        };
        let d = Diagnostic {
            path: rel(span["file_name"].as_str().unwrap_or("?")),
            line: u32_of(&span["line_start"]),
            column: u32_of(&span["column_start"]),
            severity,
            message: m["message"].as_str().unwrap_or("").to_owned(),
            code: m["code"]["code"].as_str().map(str::to_owned),
        };
        // A message for a file shared by several targets comes once per target.
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

/// `ruff check --output-format=json`.
pub fn parse_ruff(stdout: &str, rel: &dyn Fn(&str) -> String) -> Vec<Diagnostic> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(stdout) else { return Vec::new() };
    items
        .iter()
        .map(|d| {
            let code = d["code"].as_str().map(str::to_owned);
            Diagnostic {
                path: rel(d["filename"].as_str().unwrap_or("?")),
                line: u32_of(&d["location"]["row"]),
                column: u32_of(&d["location"]["column"]),
                // Ruff has no levels; a syntax error (no code) is an error, the rest warnings.
                severity: if code.is_none() { Severity::Error } else { Severity::Warning },
                message: d["message"].as_str().unwrap_or("").to_owned(),
                code,
            }
        })
        .collect()
}

/// `eslint -f json`.
pub fn parse_eslint(stdout: &str, rel: &dyn Fn(&str) -> String) -> Vec<Diagnostic> {
    let Ok(Value::Array(files)) = serde_json::from_str::<Value>(stdout) else { return Vec::new() };
    let mut out = Vec::new();
    for f in &files {
        let path = rel(f["filePath"].as_str().unwrap_or("?"));
        for m in f["messages"].as_array().into_iter().flatten() {
            out.push(Diagnostic {
                path: path.clone(),
                line: u32_of(&m["line"]),
                column: u32_of(&m["column"]),
                severity: if m["severity"] == 2 { Severity::Error } else { Severity::Warning },
                message: m["message"].as_str().unwrap_or("").to_owned(),
                code: m["ruleId"].as_str().map(str::to_owned),
            });
        }
    }
    out
}

/// `tsc --pretty false`: `path(line,col): error TS2322: message`.
pub fn parse_tsc(stdout: &str, rel: &dyn Fn(&str) -> String) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for line in stdout.lines() {
        let Some((place, rest)) = line.split_once("): ") else { continue };
        let Some((path, pos)) = place.rsplit_once('(') else { continue };
        let Some((l, c)) = pos.split_once(',') else { continue };
        let (Ok(l), Ok(c)) = (l.parse(), c.parse()) else { continue };
        let (level, rest) = rest.split_once(' ').unwrap_or((rest, ""));
        let (code, message) = match rest.split_once(": ") {
            Some((code, m)) if code.starts_with("TS") => (Some(code.to_owned()), m),
            _ => (None, rest),
        };
        let severity = if level == "error" { Severity::Error } else { Severity::Warning };
        out.push(Diagnostic { path: rel(path), line: l, column: c, severity, message: message.to_owned(), code });
    }
    out
}

/// `path:line:col: message` lines (go vet, the python syntax check); other lines skipped.
pub fn parse_colon_lines(text: &str, severity: Severity, rel: &dyn Fn(&str) -> String) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.strip_prefix("vet: ").unwrap_or(line);
        let mut parts = line.splitn(4, ':');
        let (Some(path), Some(l), Some(c), Some(message)) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (Ok(l), Ok(c)) = (l.trim().parse(), c.trim().parse()) else { continue };
        out.push(Diagnostic {
            path: rel(path.trim()),
            line: l,
            column: c,
            severity,
            message: message.trim().to_owned(),
            code: None,
        });
    }
    out
}

/// Longest a linter may run.
const TIMEOUT: Duration = Duration::from_secs(600);

/// `read_lints`.
pub struct ReadLints {
    spec: Spec,
    sandbox: Arc<dyn Sandbox>,
}

impl ReadLints {
    /// The tool, running linters in `sandbox`.
    pub fn new(sandbox: Arc<dyn Sandbox>) -> ReadLints {
        ReadLints {
            spec: Spec {
                name: "read_lints",
                description: "Diagnostics (errors, warnings) from the project's own linters and compiler: cargo \
                              clippy/check, ruff, eslint, tsc, go vet, whichever the project uses. Run it after \
                              editing to check the edits. `paths` keeps the diagnostics of those files or \
                              directories only.",
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "paths": {"type": "array", "items": {"type": "string"},
                                  "description": "Workspace-relative files or directories (default: all)"}
                    }
                }),
                read_only: true,
            },
            sandbox,
        }
    }
}

#[async_trait::async_trait]
impl Tool for ReadLints {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let mut only = Vec::new();
        for p in args.get("paths").and_then(Value::as_array).into_iter().flatten() {
            let p = p.as_str().ok_or_else(|| ToolError::new("`paths` holds strings"))?;
            only.push(ctx.relative(&ctx.resolve(p)?));
        }
        let linters = Linter::detect(&ctx.root);
        if linters.is_empty() {
            return Ok("No linter found for this project (looked for Cargo.toml, pyproject.toml, setup.py, \
                       requirements.txt or .py files, package.json with eslint installed, tsconfig.json, go.mod)."
                .to_owned());
        }
        let keep = |d: &Diagnostic| {
            only.is_empty() || only.iter().any(|p| p == "." || d.path == *p || d.path.starts_with(&format!("{p}/")))
        };
        let mut text = String::new();
        for linter in linters {
            let mut command = Command::new(linter.command(), &ctx.root);
            command.timeout = TIMEOUT;
            command.output_limit = 16 << 20;
            command.env =
                vec![("CARGO_NET_OFFLINE".into(), "true".into()), ("CARGO_TERM_COLOR".into(), "never".into())];
            let out = self.sandbox.run(&command).await.map_err(|e| ToolError::new(e.to_string()))?;
            let ran = out.stderr.lines().find_map(|l| l.strip_prefix("#linter: ")).unwrap_or(linter.name()).to_owned();
            let mut found: Vec<Diagnostic> = linter.parse(&out, ctx).into_iter().filter(|d| keep(d)).collect();
            found.sort_by(|a, b| (a.severity, &a.path, a.line).cmp(&(b.severity, &b.path, b.line)));
            let count = |s| found.iter().filter(|d| d.severity == s).count();
            text.push_str(&format!(
                "{ran}: {} errors, {} warnings{}\n",
                count(Severity::Error),
                count(Severity::Warning),
                if out.timed_out { " (killed at the time limit)" } else { "" }
            ));
            for d in &found {
                text.push_str(&format!("{d}\n"));
            }
            // A linter that failed without saying where: its own words, shortened.
            if found.is_empty() && !out.success() {
                let said: String =
                    out.stderr.lines().filter(|l| !l.starts_with("#linter: ")).collect::<Vec<_>>().join("\n");
                let said = if said.trim().is_empty() { out.stdout.clone() } else { said };
                let tail: String =
                    said.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
                text.push_str(&format!("it failed (exit {:?}) without diagnostics:\n{tail}\n", out.exit_code));
            }
        }
        Ok(truncate(text, ctx.max_output_bytes, "pass `paths` to see the diagnostics of fewer files"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn rel(p: &str) -> String {
        p.strip_prefix("/ws/").unwrap_or(p).to_owned()
    }

    #[test]
    fn cargo_messages_with_a_primary_span() {
        let out = [
            r#"{"reason":"compiler-artifact","target":{"name":"x"}}"#,
            r#"{"reason":"compiler-message","message":{"level":"warning","message":"unused variable: `x`","code":{"code":"unused_variables"},"spans":[{"file_name":"src/lib.rs","line_start":3,"column_start":9,"is_primary":true}]}}"#,
            // The same message again, for the test target.
            r#"{"reason":"compiler-message","message":{"level":"warning","message":"unused variable: `x`","code":{"code":"unused_variables"},"spans":[{"file_name":"src/lib.rs","line_start":3,"column_start":9,"is_primary":true}]}}"#,
            r#"{"reason":"compiler-message","message":{"level":"error","message":"mismatched types","code":{"code":"E0308"},"spans":[{"file_name":"src/a.rs","line_start":1,"column_start":1,"is_primary":false},{"file_name":"src/a.rs","line_start":7,"column_start":5,"is_primary":true}]}}"#,
            r#"{"reason":"compiler-message","message":{"level":"warning","message":"1 warning emitted","code":null,"spans":[]}}"#,
            "not json",
        ]
        .join("\n");
        let d = parse_cargo(&out, &rel);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d[0].to_string(), "src/lib.rs:3:9: warning: unused variable: `x` [unused_variables]");
        assert_eq!(d[1].to_string(), "src/a.rs:7:5: error: mismatched types [E0308]");
    }

    #[test]
    fn ruff_eslint_tsc_and_go_vet_outputs() {
        let ruff = r#"[{"code":"F401","message":"`os` imported but unused","filename":"/ws/app/main.py","location":{"row":1,"column":8}},
                       {"code":null,"message":"SyntaxError: Expected ')'","filename":"/ws/b.py","location":{"row":4,"column":2}}]"#;
        let d = parse_ruff(ruff, &rel);
        assert_eq!(d[0].to_string(), "app/main.py:1:8: warning: `os` imported but unused [F401]");
        assert_eq!(d[1].to_string(), "b.py:4:2: error: SyntaxError: Expected ')'");

        let eslint = r#"[{"filePath":"/ws/src/a.js","messages":[{"ruleId":"no-unused-vars","severity":2,"message":"'x' is assigned a value but never used.","line":2,"column":7},{"ruleId":"semi","severity":1,"message":"Missing semicolon.","line":3,"column":10}]},{"filePath":"/ws/src/b.js","messages":[]}]"#;
        let d = parse_eslint(eslint, &rel);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].to_string(), "src/a.js:2:7: error: 'x' is assigned a value but never used. [no-unused-vars]");
        assert_eq!(d[1].severity, Severity::Warning);

        let tsc = "src/index.ts(12,5): error TS2322: Type 'string' is not assignable to type 'number'.\n\
                   Found 1 error.\n";
        let d = parse_tsc(tsc, &rel);
        assert_eq!(
            d,
            vec![Diagnostic {
                path: "src/index.ts".into(),
                line: 12,
                column: 5,
                severity: Severity::Error,
                message: "Type 'string' is not assignable to type 'number'.".into(),
                code: Some("TS2322".into()),
            }]
        );

        let vet = "# example.com/m\n./main.go:9:2: fmt.Printf format %d has arg s of wrong type string\nvet: pkg/x.go:3:1: expected declaration\n";
        let d = parse_colon_lines(vet, Severity::Error, &|p| p.trim_start_matches("./").to_owned());
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d[0].to_string(), "main.go:9:2: error: fmt.Printf format %d has arg s of wrong type string");
        assert_eq!(d[1].path, "pkg/x.go");
    }

    #[test]
    fn linters_are_found_from_project_files() {
        let dir = std::env::temp_dir().join(format!("caret-lints-detect-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("node_modules/.bin")).unwrap();
        assert!(Linter::detect(&dir).is_empty());
        for f in ["Cargo.toml", "tool.py", "package.json", "node_modules/.bin/eslint", "tsconfig.json", "go.mod"] {
            std::fs::write(dir.join(f), "").unwrap();
        }
        assert_eq!(
            Linter::detect(&dir),
            vec![Linter::Cargo, Linter::Python, Linter::Eslint, Linter::Tsc, Linter::GoVet]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
