//! Caret's tools as other agents name them, both ways: a hook written for Claude Code sees
//! `Bash`, `Read`, `Edit`, `Write`, `Grep`, `Glob` and `LS` with their inputs (absolute
//! `file_path`s, `old_string`/`new_string`), one written for Cursor sees `Shell`, `Read`,
//! `Write`, `Edit`, `Delete`, `Grep` and `Glob`; an input a hook changes comes back as the
//! Caret tool's arguments. MCP tools keep their `mcp__server__tool` names everywhere; a tool
//! the other agent lacks (`read_lints`, `codebase_search`) keeps Caret's name.

use std::path::Path;

use serde_json::{Map, Value, json};

use super::model::Dialect;

/// `(Caret, Claude Code, Cursor)` names of the tools the other agents have too.
const NAMES: &[(&str, &str, &str)] = &[
    ("run_terminal_cmd", "Bash", "Shell"),
    ("read_file", "Read", "Read"),
    ("edit_file", "Edit", "Edit"),
    ("write_file", "Write", "Write"),
    ("delete_file", "delete_file", "Delete"),
    ("grep", "Grep", "Grep"),
    ("glob", "Glob", "Glob"),
    ("list_dir", "LS", "LS"),
    ("todo_write", "TodoWrite", "TodoWrite"),
    ("task", "Task", "Task"),
];

/// The name a hook of `dialect` knows Caret's tool `tool` by.
pub fn tool_name(dialect: Dialect, tool: &str) -> &str {
    match dialect {
        Dialect::Caret => tool,
        Dialect::Claude => NAMES.iter().find(|n| n.0 == tool).map_or(tool, |n| n.1),
        Dialect::Cursor => NAMES.iter().find(|n| n.0 == tool).map_or(tool, |n| n.2),
    }
}

/// Caret's name of the tool a `dialect` names `name` (Claude Code's `MultiEdit` is
/// `edit_file` too); a name it does not know stays as given.
pub fn caret_tool(dialect: Dialect, name: &str) -> &str {
    let found = match dialect {
        Dialect::Caret => None,
        Dialect::Claude if name == "MultiEdit" => Some("edit_file"),
        Dialect::Claude => NAMES.iter().find(|n| n.1 == name).map(|n| n.0),
        Dialect::Cursor => NAMES.iter().find(|n| n.2 == name).map(|n| n.0),
    };
    found.unwrap_or(name)
}

/// The SEARCH/REPLACE block of one replacement (what `edit_file` takes).
fn block(old: &str, new: &str) -> String {
    format!("<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n")
}

/// The one SEARCH/REPLACE block an edit holds, as (old, new); none when it holds another
/// format or several blocks.
fn one_block(edit: &str) -> Option<(String, String)> {
    let body = edit.trim_end_matches('\n');
    let rest = body.strip_prefix("<<<<<<< SEARCH\n")?;
    let (old, rest) = rest.split_once("\n=======\n").or_else(|| rest.strip_prefix("=======\n").map(|r| ("", r)))?;
    let new = rest.strip_suffix(">>>>>>> REPLACE")?;
    let new = new.strip_suffix('\n').unwrap_or(new);
    (!old.contains("<<<<<<< SEARCH") && !new.contains(">>>>>>> REPLACE")).then(|| (old.to_owned(), new.to_owned()))
}

fn text<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

/// A workspace-relative path as the absolute one other agents pass.
fn absolute(root: &Path, rel: &str) -> String {
    root.join(rel).display().to_string()
}

/// An absolute (or relative) path back as a workspace-relative one; a path outside the
/// workspace stays as given (the tool then refuses it).
fn relative(root: &Path, path: &str) -> String {
    Path::new(path).strip_prefix(root).map_or_else(|_| path.to_owned(), |p| p.display().to_string())
}

/// Caret's arguments of `tool` as a hook of `dialect` sees them.
pub fn tool_input(dialect: Dialect, tool: &str, args: &Value, root: &Path) -> Value {
    if dialect == Dialect::Caret {
        return args.clone();
    }
    let mut out = Map::new();
    let mut put = |k: &str, v: Value| {
        out.insert(k.to_owned(), v);
    };
    match tool {
        "run_terminal_cmd" => {
            put("command", args.get("command").cloned().unwrap_or(Value::Null));
            if let Some(t) = args.get("timeout_s").and_then(Value::as_u64) {
                put("timeout", json!(t * 1000));
            }
            if let Some(b) = args.get("background") {
                put("run_in_background", b.clone());
            }
            if let Some(cwd) = text(args, "cwd") {
                put("cwd", json!(absolute(root, cwd)));
            }
        }
        "read_file" => {
            put("file_path", json!(absolute(root, text(args, "path").unwrap_or(""))));
            let start = args.get("start_line").and_then(Value::as_u64);
            if let Some(s) = start {
                put("offset", json!(s));
            }
            if let Some(e) = args.get("end_line").and_then(Value::as_u64) {
                put("limit", json!(e + 1 - start.unwrap_or(1).min(e)));
            }
        }
        "edit_file" => {
            let edit = text(args, "edit").unwrap_or("");
            put("file_path", json!(absolute(root, text(args, "path").unwrap_or(""))));
            match one_block(edit) {
                Some((old, new)) => {
                    put("old_string", json!(old));
                    put("new_string", json!(new));
                }
                None => put("edit", json!(edit)),
            }
        }
        "write_file" | "delete_file" | "list_dir" => {
            let key = if tool == "list_dir" { "path" } else { "file_path" };
            put(key, json!(absolute(root, text(args, "path").unwrap_or("."))));
            if let Some(c) = args.get("content") {
                put("content", c.clone());
            }
        }
        "grep" => {
            for (from, to) in [("pattern", "pattern"), ("glob", "glob"), ("case_insensitive", "-i")] {
                if let Some(v) = args.get(from) {
                    put(to, v.clone());
                }
            }
            if let Some(p) = text(args, "path") {
                put("path", json!(absolute(root, p)));
            }
        }
        _ => return args.clone(),
    }
    Value::Object(out)
}

/// A hook's changed input of `tool` (in `dialect`'s shape) as Caret's arguments.
pub fn caret_input(dialect: Dialect, tool: &str, input: &Value, root: &Path) -> Value {
    if dialect == Dialect::Caret || !input.is_object() {
        return input.clone();
    }
    let path = |key: &str| text(input, key).map(|p| json!(relative(root, p)));
    let mut out = Map::new();
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            out.insert(k.to_owned(), v);
        }
    };
    match tool {
        "run_terminal_cmd" => {
            put("command", input.get("command").cloned());
            put("timeout_s", input.get("timeout").and_then(Value::as_u64).map(|ms| json!(ms.div_ceil(1000).max(1))));
            put("background", input.get("run_in_background").cloned());
            put("cwd", path("cwd"));
        }
        "read_file" => {
            put("path", path("file_path"));
            let offset = input.get("offset").and_then(Value::as_u64);
            put("start_line", offset.map(|o| json!(o)));
            let limit = input.get("limit").and_then(Value::as_u64);
            put("end_line", limit.map(|l| json!(offset.unwrap_or(1) + l.max(1) - 1)));
        }
        "edit_file" => {
            put("path", path("file_path"));
            let edit = match (text(input, "old_string"), text(input, "new_string")) {
                (Some(old), Some(new)) => Some(json!(block(old, new))),
                _ => input.get("edit").cloned(),
            };
            put("edit", edit);
        }
        "write_file" | "delete_file" => {
            put("path", path("file_path"));
            put("content", input.get("content").cloned());
        }
        "list_dir" => put("path", path("path")),
        "grep" => {
            put("pattern", input.get("pattern").cloned());
            put("glob", input.get("glob").cloned());
            put("case_insensitive", input.get("-i").cloned());
            put("path", path("path"));
        }
        _ => return input.clone(),
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways_and_mcp_tools_keep_theirs() {
        assert_eq!(tool_name(Dialect::Claude, "run_terminal_cmd"), "Bash");
        assert_eq!(tool_name(Dialect::Cursor, "run_terminal_cmd"), "Shell");
        assert_eq!(tool_name(Dialect::Claude, "mcp__time__now"), "mcp__time__now");
        assert_eq!(tool_name(Dialect::Claude, "read_lints"), "read_lints");
        assert_eq!(tool_name(Dialect::Caret, "read_file"), "read_file");
    }

    #[test]
    fn inputs_round_trip_through_claude_codes_shapes() {
        let root = Path::new("/work/repo");
        let edit = block("let a = 1;", "let a = 2;");
        let cases = [
            ("run_terminal_cmd", json!({"command": "cargo test", "timeout_s": 30, "cwd": "crates/x"})),
            ("read_file", json!({"path": "src/lib.rs", "start_line": 10, "end_line": 29})),
            ("edit_file", json!({"path": "src/lib.rs", "edit": edit})),
            ("write_file", json!({"path": "notes.md", "content": "hi"})),
            ("grep", json!({"pattern": "fn main", "glob": "*.rs", "case_insensitive": true, "path": "src"})),
        ];
        for (tool, args) in cases {
            let theirs = tool_input(Dialect::Claude, tool, &args, root);
            assert_eq!(caret_input(Dialect::Claude, tool, &theirs, root), args, "{tool}: {theirs}");
        }
        let read =
            tool_input(Dialect::Claude, "read_file", &json!({"path": "a.rs", "start_line": 10, "end_line": 29}), root);
        assert_eq!(read, json!({"file_path": "/work/repo/a.rs", "offset": 10, "limit": 20}));
        let edit = tool_input(Dialect::Claude, "edit_file", &json!({"path": "a.rs", "edit": edit}), root);
        assert_eq!(
            (edit["old_string"].as_str(), edit["new_string"].as_str()),
            (Some("let a = 1;"), Some("let a = 2;"))
        );
        // An edit in another format goes as it is.
        let lazy = json!({"path": "a.rs", "edit": "// ... existing code ...\nfn b() {}\n"});
        assert!(tool_input(Dialect::Claude, "edit_file", &lazy, root).get("old_string").is_none());
    }
}
