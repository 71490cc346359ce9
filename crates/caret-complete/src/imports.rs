//! Next edits about imports:
//! - [`missing_import`]: the import a new name needs. When the last edit brought in a name
//!   that the file neither imports nor uses anywhere else, and another open file imports it,
//!   the same import is predicted after the file's last import line (or at its top).
//! - [`superseded`]: the other half of an import moved. When the last edit made an import line
//!   bind a name (`from typing import Any` → `from typing import Any, Literal`), another import
//!   of that name in the file loses it: the line deleted when it bound nothing else
//!   (`from ._typing import Literal`), else the name taken out of its list.
//! - [`rebound`]: an import that binds another name now (`import io/ioutil` → `import os`,
//!   `use std::collections::HashMap` → `use indexmap::IndexMap`): the old name's uses, renamed.
//!
//! Python (`import`, `from … import`), Rust (`use`) and JavaScript/TypeScript (`import … from`);
//! [`rebound`] reads Go's quoted import paths too; other languages predict nothing.

use crate::next_edit::{Edit, Prediction, Why};

/// The import lines' language of `path`, by its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lang {
    Python,
    Rust,
    Script,
}

fn lang(path: &str) -> Option<Lang> {
    let ext = path.rsplit('.').next()?;
    match ext {
        "py" | "pyi" => Some(Lang::Python),
        "rs" => Some(Lang::Rust),
        "js" | "jsx" | "mjs" | "ts" | "tsx" | "mts" => Some(Lang::Script),
        _ => None,
    }
}

impl Lang {
    fn is_import(self, line: &str) -> bool {
        let l = line.trim_start();
        match self {
            Lang::Python => l.starts_with("import ") || l.starts_with("from ") && l.contains(" import "),
            Lang::Rust => l.starts_with("use ") || l.starts_with("pub use "),
            Lang::Script => l.starts_with("import "),
        }
    }

    /// The import of `name` alone that `line` (an import of it, perhaps among others) makes.
    fn narrowed(self, line: &str, name: &str) -> String {
        let line = line.trim();
        match self {
            Lang::Python => match line.split_once(" import ") {
                Some((from, names)) if names.contains(',') || names.contains('(') => format!("{from} import {name}"),
                _ => line.to_owned(),
            },
            Lang::Rust => match line.split_once("::{") {
                Some((path, _)) => format!("{path}::{name};"),
                None => line.to_owned(),
            },
            Lang::Script => match (line.find('{'), line.rfind("} from ")) {
                (Some(_), Some(end)) => format!("import {{ {name} }}{}", &line[end + 1..]),
                _ => line.to_owned(),
            },
        }
    }

    /// A one-line import statement taken apart: the byte range of its list of items within
    /// `line` and the name each item binds (`None`: `self`, a glob, a nested group). `None`
    /// when `line` is no import complete on its line.
    fn items(self, line: &str) -> Option<Import> {
        let body = line.trim_end();
        let lead = body.len() - body.trim_start().len();
        let body = &body[lead..];
        // The list's bounds within `body`, and how an item names what it binds.
        let (from, to) = match self {
            Lang::Python => {
                if body.ends_with('\\') || body.contains('(') != body.contains(')') {
                    return None;
                }
                let code = body.split(" #").next().unwrap_or(body).trim_end();
                let start = if body.starts_with("from ") {
                    code.find(" import ")? + 8
                } else {
                    code.strip_prefix("import ").map(|_| 7)?
                };
                let (mut from, mut to) = (start, code.len());
                if code[from..].starts_with('(') && code.ends_with(')') {
                    from += 1;
                    to -= 1;
                }
                (from, to)
            }
            Lang::Rust => {
                let code = body.strip_prefix("pub ").unwrap_or(body);
                let skip = body.len() - code.len();
                let code = code.strip_prefix("use ")?.strip_suffix(';')?;
                let at = skip + 4;
                match (code.find("::{"), code.ends_with('}')) {
                    (Some(open), true) => {
                        if code[open + 3..code.len() - 1].contains('{') {
                            return None;
                        }
                        (at + open + 3, at + code.len() - 1)
                    }
                    (None, false) => (at, at + code.len()),
                    _ => return None,
                }
            }
            Lang::Script => {
                let code = body.strip_prefix("import ")?;
                let end = code.rfind(" from ")?;
                let head = &code[..end];
                let head_at = body.len() - code.len();
                match (head.find('{'), head.rfind('}')) {
                    (Some(open), Some(close)) if close > open => (head_at + open + 1, head_at + close),
                    (None, None) => (head_at, head_at + end),
                    _ => return None,
                }
            }
        };
        let list = &body[from..to];
        let mut names = Vec::new();
        let mut offset = from;
        for item in list.split(',') {
            let name = (!item.trim().is_empty()).then(|| self.binds(item.trim())).flatten();
            names.push((lead + offset..lead + offset + item.len(), name));
            offset += item.len() + 1;
        }
        Some(Import { list: lead + from..lead + to, items: names })
    }

    /// The name one item of an import's list binds.
    fn binds(self, item: &str) -> Option<String> {
        let item = match self {
            Lang::Script => item.strip_prefix("type ").unwrap_or(item).trim(),
            _ => item,
        };
        let name = match item.rsplit_once(" as ") {
            Some((_, alias)) => alias.trim(),
            None => match self {
                // `from m import b` binds `b`; `import a.b` binds `a` too, but beside an
                // `import a` on purpose (the package and its module), so it moves nothing.
                Lang::Python if item.contains('.') => return None,
                Lang::Python => item,
                Lang::Rust => item.rsplit("::").next()?,
                Lang::Script => item,
            },
        };
        (name != "self" && !name.is_empty() && name.chars().all(is_word)).then(|| name.to_owned())
    }
}

/// An import statement on one line: its list's byte range, and each item's range and the name
/// it binds.
struct Import {
    list: std::ops::Range<usize>,
    items: Vec<(std::ops::Range<usize>, Option<String>)>,
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whole-word occurrences of `name` in `text`.
fn occurrences<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = usize> + 'a {
    text.match_indices(name).map(|(at, _)| at).filter(move |&at| {
        !text[..at].chars().next_back().is_some_and(is_word)
            && !text[at + name.len()..].chars().next().is_some_and(is_word)
    })
}

/// The import `text` (the current text of `path`) lacks after `last`, the newest edit, taken
/// from one of `others` (other open files: path and text) of the same language.
pub fn missing_import(last: &Edit, path: &str, text: &str, others: &[(&str, &str)]) -> Option<Prediction> {
    let lang = lang(path)?;
    if last.path != path || last.new.len() > 200 {
        return None;
    }
    let own = last.start..last.start + last.new.len();
    let names =
        last.new.split(|c: char| !is_word(c)).filter(|w| w.len() >= 2 && !w.starts_with(|c: char| c.is_ascii_digit()));
    for name in names {
        // Known to the file already (imported, defined or used elsewhere in it).
        if last.old.split(|c: char| !is_word(c)).any(|w| w == name)
            || occurrences(text, name).any(|at| !own.contains(&at))
        {
            continue;
        }
        let import = others.iter().filter(|(p, _)| lang_of_same(p, lang)).find_map(|(_, t)| {
            t.lines()
                .find(|l| lang.is_import(l) && occurrences(l, name).next().is_some())
                .map(|l| lang.narrowed(l, name))
        });
        let Some(import) = import else { continue };
        // After the last line of the file's imports at its top (blank lines and comments
        // among them), else at the very top.
        let mut at = 0;
        for (start, line) in lines_at(text) {
            let t = line.trim();
            if lang.is_import(line) {
                at = start + line.len();
            } else if !(t.is_empty() || t.starts_with('#') || t.starts_with("//")) {
                break;
            }
        }
        let replacement =
            if at > 0 && !text[..at].ends_with('\n') { format!("\n{import}") } else { format!("{import}\n") };
        return Some(Prediction { path: path.to_owned(), start: at, end: at, replacement, why: Why::Import });
    }
    None
}

/// The other half of an import moved: after `last`, which made an import line of `path` (now
/// `text`) bind names it did not bind before, each other one-line import in the file that binds
/// one of them without it — deleted when it binds nothing else, else rewritten without those
/// names ([`Why::Moved`]).
pub fn superseded(last: &Edit, path: &str, text: &str) -> Vec<Prediction> {
    let Some(lang) = lang(path) else { return Vec::new() };
    if last.path != path || last.new_lines.len() > 1000 {
        return Vec::new();
    }
    let bound = |lines: &str| -> Vec<String> {
        lines
            .lines()
            .filter(|l| lang.is_import(l))
            .filter_map(|l| lang.items(l))
            .flat_map(|i| i.items.into_iter().filter_map(|(_, n)| n))
            .collect()
    };
    // Bound more often after the edit than before it (a line typed above an import of the
    // same name can settle as an edit of both lines).
    let mut before = bound(&last.old_lines);
    let mut moved = Vec::new();
    for name in bound(&last.new_lines) {
        match before.iter().position(|b| *b == name) {
            Some(i) => drop(before.swap_remove(i)),
            None => moved.push(name),
        }
    }
    if moved.is_empty() {
        return Vec::new();
    }
    // Of the edited lines, one that was there before is another import still.
    let own = edited_lines(last, text);
    let mut out = Vec::new();
    for (at, line) in lines_at(text) {
        let offset = at + line.len();
        let content = line.trim_end_matches('\n');
        if !lang.is_import(line) || own.contains(&at) && !last.old_lines.lines().any(|l| l == content) {
            continue;
        }
        let Some(import) = lang.items(content) else { continue };
        let taken = |n: &Option<String>| n.as_ref().is_some_and(|n| moved.contains(n));
        if !import.items.iter().any(|(_, n)| taken(n)) {
            continue;
        }
        let kept: Vec<&str> = import
            .items
            .iter()
            .filter(|(_, n)| !taken(n))
            .map(|(r, _)| line[r.clone()].trim())
            .filter(|i| !i.is_empty())
            .collect();
        let default_import = lang == Lang::Script && line[..import.list.start].contains(',');
        let (end, replacement) = if kept.is_empty() && !default_import {
            (offset, String::new())
        } else if kept.is_empty() {
            // `import X, { a } from 'm'` keeps its default: `import X from 'm'`.
            let head = content[..import.list.start].trim_end_matches('{').trim_end().trim_end_matches(',');
            let tail = content[import.list.end..].trim_start_matches('}').trim_start();
            (at + content.len(), format!("{head} {tail}"))
        } else {
            let joined = kept.join(", ");
            // TypeScript's `{ a, b }` keeps its spaces inside the braces.
            let spaced = lang == Lang::Script && content[import.list.clone()].starts_with(' ');
            let new_list = if spaced { format!(" {joined} ") } else { joined };
            let mut rewritten = format!("{}{new_list}{}", &content[..import.list.start], &content[import.list.end..]);
            // `use a::{b};` is written `use a::b;`.
            if lang == Lang::Rust && kept.len() == 1 {
                rewritten = rewritten.replacen(&format!("::{{{}}}", kept[0]), &format!("::{}", kept[0]), 1);
            }
            (at + content.len(), rewritten)
        };
        out.push(Prediction { path: path.to_owned(), start: at, end, replacement, why: Why::Moved });
    }
    out
}

/// The name a Go import line binds: its alias, else its path's last element (a major
/// version's `v2` passed over).
fn go_binds(line: &str) -> Option<String> {
    let l = line.trim();
    let l = l.strip_prefix("import ").unwrap_or(l).trim_start();
    let (alias, quoted) = match l.split_once(' ') {
        Some((alias, rest)) => (Some(alias), rest.trim()),
        None => (None, l),
    };
    let path = quoted.strip_prefix('"')?.strip_suffix('"')?;
    let name = match alias {
        Some(a) => a,
        None => {
            let mut parts = path.rsplit('/');
            let last = parts.next()?;
            let version = last.len() > 1 && last.starts_with('v') && last[1..].bytes().all(|b| b.is_ascii_digit());
            if version { parts.next()? } else { last }
        }
    };
    (name.chars().all(is_word) && !name.is_empty() && name != "_").then(|| name.to_owned())
}

/// The uses of a name an import no longer binds, renamed: after `last`, whose import lines in
/// `path` (now `text`) bound one name before that they bind no longer and one that they did
/// not, each other line that uses the old name (a whole word), not imported elsewhere in the
/// file, with it renamed ([`Why::Analogous`]).
pub fn rebound(last: &Edit, path: &str, text: &str) -> Vec<Prediction> {
    let go = path.ends_with(".go");
    let lang = lang(path);
    if last.path != path || last.new_lines.len() > 1000 || !go && lang.is_none() {
        return Vec::new();
    }
    let binds = |line: &str| -> Vec<String> {
        match lang {
            Some(lang) if lang.is_import(line) => {
                lang.items(line).map(|i| i.items.into_iter().filter_map(|(_, n)| n).collect()).unwrap_or_default()
            }
            _ if go => go_binds(line).into_iter().collect(),
            _ => Vec::new(),
        }
    };
    let bound = |lines: &str| -> Vec<String> { lines.lines().flat_map(binds).collect() };
    let (before, after) = (bound(&last.old_lines), bound(&last.new_lines));
    let gone: Vec<&String> = before.iter().filter(|n| !after.contains(n)).collect();
    let came: Vec<&String> = after.iter().filter(|n| !before.contains(n)).collect();
    let ([old], [new]) = (gone.as_slice(), came.as_slice()) else { return Vec::new() };
    let own = edited_lines(last, text);
    let mut out = Vec::new();
    for (at, line) in lines_at(text) {
        let content = line.trim_end_matches('\n');
        let bound_here = binds(content);
        if bound_here.contains(old) {
            // Still imported by another line: its uses stand.
            return Vec::new();
        }
        if own.contains(&at) || !bound_here.is_empty() {
            continue;
        }
        let uses: Vec<usize> = occurrences(content, old).collect();
        if uses.is_empty() {
            continue;
        }
        let mut rewritten = String::with_capacity(content.len() + uses.len() * new.len());
        let mut copied = 0;
        for u in uses {
            rewritten.push_str(&content[copied..u]);
            rewritten.push_str(new);
            copied = u + old.len();
        }
        rewritten.push_str(&content[copied..]);
        out.push(Prediction {
            path: path.to_owned(),
            start: at,
            end: at + content.len(),
            replacement: rewritten,
            why: Why::Analogous,
        });
    }
    out
}

/// The bytes of the edited lines in `text` (after `last`): from the start of the edit's line,
/// as long as its new lines.
fn edited_lines(last: &Edit, text: &str) -> std::ops::Range<usize> {
    let start = text[..last.start.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
    start..start + last.new_lines.len()
}

/// Each line of `text` with the byte it starts at (its newline included).
fn lines_at(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split_inclusive('\n').scan(0, |offset, line| {
        let at = *offset;
        *offset += line.len();
        Some((at, line))
    })
}

fn lang_of_same(path: &str, lang: Lang) -> bool {
    self::lang(path) == Some(lang)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::next_edit::edit_of;

    #[test]
    fn an_import_that_binds_another_name_renames_the_old_ones_uses() {
        let rebound_after = |path: &str, before: &str, from: &str, to: &str| {
            let after = before.replacen(from, to, 1);
            let last = edit_of(path, before, &after);
            let found = rebound(&last, path, &after);
            // From the last to the first, so that each applies where it was found.
            found.iter().rev().fold(after.clone(), |t, p| p.apply(&t))
        };
        let go = "import (\n\t\"fmt\"\n\t\"io/ioutil\"\n)\n\nfunc f() {\n\tb, _ := ioutil.ReadFile(\"x\")\n\tfmt.Println(ioutil.Discard, b)\n}\n";
        assert_eq!(
            rebound_after("a.go", go, "\"io/ioutil\"", "\"os\""),
            go.replace("\"io/ioutil\"", "\"os\"").replace("ioutil.", "os.")
        );
        // A major version's element is no name: `github.com/a/yaml/v3` binds `yaml`.
        assert_eq!(go_binds("\t\"github.com/a/yaml/v3\""), Some("yaml".to_owned()));
        assert_eq!(go_binds("\tfs \"io/fs\""), Some("fs".to_owned()));
        let py = "import pkg.internal as pi\n\nassert pi.READY\nx = pi.load(pi)\n";
        assert_eq!(
            rebound_after("a.py", py, "import pkg.internal as pi", "from pkg.internal import bases"),
            "from pkg.internal import bases\n\nassert bases.READY\nx = bases.load(bases)\n"
        );
        let rs = "use std::collections::HashMap;\n\nstruct A(HashMap<u8, u8>);\n";
        assert_eq!(
            rebound_after("a.rs", rs, "use std::collections::HashMap;", "use indexmap::IndexMap;"),
            "use indexmap::IndexMap;\n\nstruct A(IndexMap<u8, u8>);\n"
        );
        // Still imported by another line, or two names changed: nothing.
        let twice = "import a as x\nfrom b import x\nx.go()\n";
        let last = edit_of("a.py", twice, &twice.replacen("import a as x", "import a as y", 1));
        assert!(rebound(&last, "a.py", &twice.replacen("import a as x", "import a as y", 1)).is_empty());
        let two = "from m import a, b\na.go(b)\n";
        let after = two.replacen("import a, b", "import c, d", 1);
        assert!(rebound(&edit_of("a.py", two, &after), "a.py", &after).is_empty());
    }

    #[test]
    fn a_new_name_brings_the_import_another_file_has() {
        let before = "import os\n\ndef load(p):\n    return open(p).read()\n";
        let after = "import os\n\ndef load(p):\n    return json.loads(open(p).read())\n";
        let last = edit_of("a.py", before, after);
        let other = "import sys\nimport json\n\nprint(json.dumps({}))\n";
        let p = missing_import(&last, "a.py", after, &[("b.py", other)]).expect("the import");
        assert_eq!((p.why, p.replacement.as_str(), p.start), (Why::Import, "import json\n", "import os\n".len()));
        assert_eq!(p.apply(after), "import os\nimport json\n\ndef load(p):\n    return json.loads(open(p).read())\n");
        // Imported already, or another language's file: nothing.
        let imported = format!("import json\n{after}");
        assert!(missing_import(&last, "a.py", &imported, &[("b.py", other)]).is_none());
        assert!(missing_import(&last, "a.py", after, &[("b.rs", "use json;\n")]).is_none());
    }

    #[test]
    fn one_name_of_a_grouped_import_and_files_without_imports() {
        let before = "fn main() {\n    let p = 1;\n}\n";
        let after = "fn main() {\n    let p = PathBuf::new();\n}\n";
        let last = edit_of("src/main.rs", before, after);
        let other = "use std::path::{Path, PathBuf};\n";
        let p = missing_import(&last, "src/main.rs", after, &[("src/lib.rs", other)]).expect("the import");
        assert_eq!((p.start, p.replacement.as_str()), (0, "use std::path::PathBuf;\n"));
        let py = "from a.b import (x, y, Thing)\n";
        assert_eq!(Lang::Python.narrowed(py, "Thing"), "from a.b import Thing");
        let ts = "import { a, useState } from 'react';";
        assert_eq!(Lang::Script.narrowed(ts, "useState"), "import { useState } from 'react';");
    }

    fn superseded_after(path: &str, before: &str, after: &str) -> Vec<String> {
        let last = edit_of(path, before, after);
        superseded(&last, path, after).iter().map(|p| p.apply(after)).collect()
    }

    #[test]
    fn a_name_imported_anew_leaves_its_old_import() {
        // Python: the old import bound only the name: deleted; bound others too: narrowed.
        let before = "from typing import Any\nfrom ._typing import Literal\n\nx: Literal[1]\n";
        let after = before.replace("import Any\n", "import Any, Literal\n");
        assert_eq!(superseded_after("a.py", before, &after), ["from typing import Any, Literal\n\nx: Literal[1]\n"]);
        let before = "import os\nfrom typing_extensions import Protocol, Self  # compat\n";
        let after = format!("from typing import Self\n{before}");
        let p = superseded(&edit_of("a.py", before, &after), "a.py", &after);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].why, Why::Moved);
        assert_eq!(
            p[0].apply(&after),
            "from typing import Self\nimport os\nfrom typing_extensions import Protocol  # compat\n"
        );
        // A name the edited line bound before is no move; nor is an import of another name.
        let before = "from a import x, y\nfrom b import y\nfrom c import z\n";
        let after = before.replacen("x, y", "x, y, w", 1);
        assert!(superseded_after("a.py", before, &after).is_empty());
        // `import datetime` and `from datetime import datetime` bind the same name.
        let before = "import os\nfrom datetime import datetime\n";
        let after = format!("import datetime\n{before}");
        assert_eq!(superseded_after("a.py", before, &after), ["import datetime\nimport os\n"]);
    }

    #[test]
    fn a_moved_import_in_typescript_and_rust() {
        let before = "import { globalObject } from '@x/util'\nimport { Observable, merge } from '../tools/observable'\nimport type { Ctx } from '../ctx'\n";
        let after = before.replacen("{ globalObject }", "{ globalObject, Observable }", 1);
        assert_eq!(
            superseded_after("a.ts", before, &after),
            [
                "import { globalObject, Observable } from '@x/util'\nimport { merge } from '../tools/observable'\nimport type { Ctx } from '../ctx'\n"
            ]
        );
        let after = before.replacen("{ globalObject }", "{ globalObject, Observable, merge }", 1);
        assert_eq!(
            superseded_after("a.ts", before, &after),
            ["import { globalObject, Observable, merge } from '@x/util'\nimport type { Ctx } from '../ctx'\n"]
        );
        let before = "use std::fmt;\nuse unic::{CharRange, Other};\nuse lazy::Lazy;\n";
        let after = format!("use crate::range::CharRange;\n{before}");
        assert_eq!(
            superseded_after("src/a.rs", before, &after),
            ["use crate::range::CharRange;\nuse std::fmt;\nuse unic::Other;\nuse lazy::Lazy;\n"]
        );
        let after = format!("use crate::lazy::Lazy as Lazy;\n{before}");
        assert_eq!(
            superseded_after("src/a.rs", before, &after),
            ["use crate::lazy::Lazy as Lazy;\nuse std::fmt;\nuse unic::{CharRange, Other};\n"]
        );
        // A default import stays when its braces empty.
        let before = "import React, { useState } from 'react'\nimport { x } from './x'\n";
        let after = format!("import {{ useState }} from 'preact/hooks'\n{before}");
        assert_eq!(
            superseded_after("a.tsx", before, &after),
            ["import { useState } from 'preact/hooks'\nimport React from 'react'\nimport { x } from './x'\n"]
        );
        // `import os.path` beside `import os` is no move.
        let before = "import os\nimport sys\n";
        let after = format!("import os.path\n{before}");
        assert!(superseded_after("a.py", before, &after).is_empty());
        // Another language, or no import made: nothing.
        assert!(superseded_after("a.go", "import \"fmt\"\n", "import \"fmt\"\nimport \"os\"\n").is_empty());
        assert!(superseded_after("a.py", "from a import b\nx = 1\n", "from a import b\nx = b\n").is_empty());
    }
}
