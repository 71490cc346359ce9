//! A next edit of its own kind: the import a new name needs. When the last edit brought in a
//! name that the file neither imports nor uses anywhere else, and another open file imports
//! it, the same import is predicted after the file's last import line (or at its top).
//! Python (`import`, `from … import`), Rust (`use`) and JavaScript/TypeScript (`import … from`);
//! other languages predict nothing.

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
        let mut offset = 0;
        for line in text.split_inclusive('\n') {
            let t = line.trim();
            if lang.is_import(line) {
                at = offset + line.len();
            } else if !(t.is_empty() || t.starts_with('#') || t.starts_with("//")) {
                break;
            }
            offset += line.len();
        }
        let replacement =
            if at > 0 && !text[..at].ends_with('\n') { format!("\n{import}") } else { format!("{import}\n") };
        return Some(Prediction { path: path.to_owned(), start: at, end: at, replacement, why: Why::Import });
    }
    None
}

fn lang_of_same(path: &str, lang: Lang) -> bool {
    self::lang(path) == Some(lang)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::next_edit::edit_of;

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
}
