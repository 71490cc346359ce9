//! Which lines of a source file are comments (doc comments, block comments, Python
//! docstrings), by the file's language: the reranking uses it to tell a chunk that explains
//! a behaviour from the one that implements it.
//!
//! A line-level guess, not a parse: a line is a comment when it holds only comment text (a
//! trailing `// note` after code leaves the line code). Languages it does not know get `None`.

/// How a language writes comments.
struct Syntax {
    /// Line comment markers.
    line: &'static [&'static str],
    /// Block comments (open, close).
    block: Option<(&'static str, &'static str)>,
    /// Python's docstrings: a string statement in triple quotes.
    docstrings: bool,
}

const C_LIKE: Syntax = Syntax { line: &["//"], block: Some(("/*", "*/")), docstrings: false };
const HASH: Syntax = Syntax { line: &["#"], block: None, docstrings: false };
const PYTHON: Syntax = Syntax { line: &["#"], block: None, docstrings: true };
const DASHES: Syntax = Syntax { line: &["--"], block: None, docstrings: false };

fn syntax_of(path: &str) -> Option<Syntax> {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase())?;
    Some(match ext.as_str() {
        "rs" | "go" | "java" | "js" | "jsx" | "mjs" | "cjs" | "ts" | "tsx" | "mts" | "cts" | "c" | "h" | "cc"
        | "cpp" | "cxx" | "hpp" | "hh" | "cs" | "kt" | "kts" | "swift" | "scala" | "php" | "dart" | "zig" => C_LIKE,
        "py" | "pyi" => PYTHON,
        "rb" | "sh" | "bash" | "zsh" | "pl" | "pm" | "r" | "jl" | "ex" | "exs" | "nim" => HASH,
        "sql" | "lua" | "hs" | "elm" | "ada" => DASHES,
        _ => return None,
    })
}

/// For each line of `text` (a file at `path`), whether it is only comment; `None` for a
/// language this does not know.
pub(crate) fn comment_lines(path: &str, text: &str) -> Option<Vec<bool>> {
    let syntax = syntax_of(path)?;
    let mut out = Vec::new();
    // Inside a block comment (its closing marker), or a docstring (its quotes).
    let mut open: Option<&'static str> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(close) = open {
            out.push(true);
            if t.contains(close) {
                open = None;
            }
            continue;
        }
        if syntax.line.iter().any(|m| t.starts_with(m)) {
            out.push(true);
            continue;
        }
        if let Some((start, end)) = syntax.block
            && let Some(rest) = t.strip_prefix(start)
        {
            out.push(true);
            if !rest.contains(end) {
                open = Some(end);
            }
            continue;
        }
        if syntax.docstrings {
            let body = t.trim_start_matches(['r', 'R', 'b', 'B', 'u', 'U']);
            if let Some(quotes) = ["\"\"\"", "'''"].into_iter().find(|q| body.starts_with(q)) {
                out.push(true);
                if !body[3..].contains(quotes) {
                    open = Some(quotes);
                }
                continue;
            }
        }
        out.push(false);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_by_language() {
        let rust =
            "//! A module.\n/// Adds.\npub fn add() {} // trailing\n/* a\n   block */\nlet x = 1;\n#[derive(Debug)]\n";
        assert_eq!(comment_lines("src/a.rs", rust).unwrap(), [true, true, false, true, true, false, false]);
        let python =
            "# note\ndef f():\n    \"\"\"Doc\n    more.\n    \"\"\"\n    return 1\n    r'''one line'''\nx = '#'\n";
        assert_eq!(comment_lines("m.py", python).unwrap(), [true, false, true, true, true, false, true, false]);
        let go = "// Package p.\npackage p\n/* one line */\nfunc F() {}\n";
        assert_eq!(comment_lines("p.go", go).unwrap(), [true, false, true, false]);
        assert_eq!(comment_lines("q.sql", "-- why\nSELECT 1;\n").unwrap(), [true, false]);
        assert!(comment_lines("README.md", "# Title\n").is_none(), "prose is not commented code");
        assert!(comment_lines("Makefile", "# x\n").is_none());
    }
}
