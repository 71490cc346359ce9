//! Patch envelopes: several files' changes in one edit.
//!
//! ```text
//! *** Begin Patch
//! *** Add File: src/new.rs
//! +fn new() {}
//! *** Update File: src/lib.rs
//! *** Move to: src/core.rs
//! @@ fn run() {
//!      let x = 1;
//! -    old();
//! +    new();
//! *** Delete File: src/old.rs
//! *** End Patch
//! ```
//!
//! An `@@` line starts a hunk; text after it names a line the hunk comes after (a function's
//! signature), which places the hunk when its context appears more than once. Hunks are
//! applied like unified-diff hunks. Nothing is written unless every file's change applies:
//! [`plan`] returns the whole set of writes and deletions, or the first error.

use crate::matcher::find;
use crate::text::edit_lines;
use crate::udiff::{FileDiff, Hunk, Line};
use crate::{Error, Result, Text};

/// One file's operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOp {
    /// Create a file with these lines.
    Add {
        /// Its path.
        path: String,
        /// Its lines.
        lines: Vec<String>,
    },
    /// Delete a file.
    Delete {
        /// Its path.
        path: String,
    },
    /// Change a file, and perhaps move it.
    Update {
        /// Its path.
        path: String,
        /// Where it moves, if it does.
        move_to: Option<String>,
        /// The hunks, each with the line it comes after, if named.
        hunks: Vec<(Option<String>, Hunk)>,
    },
}

/// What applying a patch does to the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Write these bytes to a path (creating it if need be).
    Write {
        /// The path.
        path: String,
        /// The new contents.
        bytes: Vec<u8>,
    },
    /// Remove a path.
    Delete {
        /// The path.
        path: String,
    },
}

/// Whether text looks like a patch envelope.
pub fn detect(edit: &str) -> bool {
    edit.lines().any(|l| l.trim() == "*** Begin Patch")
}

/// Parses a patch envelope.
pub fn parse(edit: &str) -> Result<Vec<FileOp>> {
    if edit.contains('\0') {
        return Err(Error::Malformed("the patch contains NUL bytes".to_owned()));
    }
    let lines = edit_lines(edit);
    let begin = lines
        .iter()
        .position(|l| l.trim() == "*** Begin Patch")
        .ok_or_else(|| Error::Malformed("no *** Begin Patch line".to_owned()))?;
    let mut ops = Vec::new();
    let mut i = begin + 1;
    let mut ended = false;
    while i < lines.len() {
        let l = lines[i];
        if l.trim() == "*** End Patch" {
            ended = true;
            break;
        }
        if let Some(path) = l.strip_prefix("*** Add File: ") {
            i += 1;
            let mut body = Vec::new();
            while i < lines.len() && !lines[i].starts_with("*** ") {
                let t = lines[i]
                    .strip_prefix('+')
                    .ok_or_else(|| Error::Malformed(format!("line {} of an added file must start with +", i + 1)))?;
                body.push(t.to_owned());
                i += 1;
            }
            ops.push(FileOp::Add { path: path.trim().to_owned(), lines: body });
        } else if let Some(path) = l.strip_prefix("*** Delete File: ") {
            ops.push(FileOp::Delete { path: path.trim().to_owned() });
            i += 1;
        } else if let Some(path) = l.strip_prefix("*** Update File: ") {
            i += 1;
            let mut move_to = None;
            if let Some(to) = lines.get(i).and_then(|l| l.strip_prefix("*** Move to: ")) {
                move_to = Some(to.trim().to_owned());
                i += 1;
            }
            let mut hunks: Vec<(Option<String>, Hunk)> = Vec::new();
            while i < lines.len() && !(lines[i].starts_with("*** ") && lines[i].trim() != "*** End of File") {
                let l = lines[i];
                if let Some(rest) = l.strip_prefix("@@") {
                    let anchor = rest.trim();
                    hunks.push(((!anchor.is_empty()).then(|| anchor.to_owned()), Hunk::default()));
                } else if l.trim() == "*** End of File" {
                    // The hunk ends the file: nothing to do beyond matching its context.
                } else {
                    if hunks.is_empty() {
                        hunks.push((None, Hunk::default()));
                    }
                    let line = match l.chars().next() {
                        Some('+') => Line::Add(l[1..].to_owned()),
                        Some('-') => Line::Remove(l[1..].to_owned()),
                        Some(' ') => Line::Context(l[1..].to_owned()),
                        None => Line::Context(String::new()),
                        Some(_) => {
                            return Err(Error::Malformed(format!(
                                "line {} of an update must start with ' ', '-', '+' or @@: {l:?}",
                                i + 1
                            )));
                        }
                    };
                    if let Some((_, h)) = hunks.last_mut() {
                        h.lines.push(line);
                    }
                }
                i += 1;
            }
            hunks.retain(|(_, h)| !h.lines.is_empty());
            if hunks.is_empty() && move_to.is_none() {
                return Err(Error::Malformed(format!("the update of {} changes nothing", path.trim())));
            }
            ops.push(FileOp::Update { path: path.trim().to_owned(), move_to, hunks });
        } else if l.trim().is_empty() {
            i += 1;
        } else {
            return Err(Error::Malformed(format!("line {} of the patch is not part of a file: {l:?}", i + 1)));
        }
    }
    if !ended {
        return Err(Error::Malformed("no *** End Patch line: the patch may be cut short".to_owned()));
    }
    Ok(ops)
}

/// A path the patch may touch: relative, inside the tree.
fn checked(path: &str) -> Result<&str> {
    let p = std::path::Path::new(path);
    let inside = p.components().all(|c| matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir));
    if path.is_empty() || !inside {
        return Err(Error::Malformed(format!("{path:?} is not a relative path inside the workspace")));
    }
    Ok(path)
}

/// Works out every change a patch makes; `read` gives a file's bytes (`None`: no such file).
/// Nothing is written: the caller applies the changes, all or none.
pub fn plan(ops: &[FileOp], read: &dyn Fn(&str) -> std::io::Result<Option<Vec<u8>>>) -> Result<Vec<Change>> {
    let io = |path: &str, e: std::io::Error| Error::NotText(format!("{path}: {e}"));
    let mut changes = Vec::new();
    for op in ops {
        match op {
            FileOp::Add { path, lines } => {
                if read(checked(path)?).map_err(|e| io(path, e))?.is_some() {
                    return Err(Error::Malformed(format!("{path} exists already: update it instead of adding it")));
                }
                let text = Text { lines: lines.clone(), eol: crate::Eol::Lf, final_newline: true, bom: false };
                changes.push(Change::Write { path: path.clone(), bytes: text.render().into_bytes() });
            }
            FileOp::Delete { path } => {
                if read(checked(path)?).map_err(|e| io(path, e))?.is_none() {
                    return Err(Error::Malformed(format!("{path} does not exist: nothing to delete")));
                }
                changes.push(Change::Delete { path: path.clone() });
            }
            FileOp::Update { path, move_to, hunks } => {
                let bytes = read(checked(path)?)
                    .map_err(|e| io(path, e))?
                    .ok_or_else(|| Error::Malformed(format!("{path} does not exist: nothing to update")))?;
                let text = Text::parse(&bytes).map_err(|e| Error::NotText(format!("{path}: {e}")))?;
                let file = text.line_refs();
                // A hunk's named line places it: its line number becomes the hunk's hint.
                let mut from = 0;
                let mut diff = FileDiff { old_path: Some(path.clone()), new_path: move_to.clone(), hunks: Vec::new() };
                for (anchor, hunk) in hunks {
                    let mut hunk = hunk.clone();
                    if let Some(a) = anchor {
                        let found = find(&file, &[a.as_str()], from)
                            .map_err(|e| Error::Malformed(format!("{path}: the hunk's @@ {a}: {e}")))?;
                        from = found.start;
                        hunk.old_start = Some(found.start + 2);
                    }
                    diff.hunks.push(hunk);
                }
                let new = crate::udiff::apply(&text, &diff).map_err(|e| match e {
                    Error::NoMatch { anchor } => Error::NoMatch { anchor: format!("{path}:\n{anchor}") },
                    other => other,
                })?;
                let target = move_to.as_deref().map(checked).transpose()?.unwrap_or(path);
                changes.push(Change::Write { path: target.to_owned(), bytes: new.render().into_bytes() });
                if target != path {
                    changes.push(Change::Delete { path: path.clone() });
                }
            }
        }
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn tree(files: &[(&str, &str)]) -> HashMap<String, Vec<u8>> {
        files.iter().map(|(p, c)| ((*p).to_owned(), c.as_bytes().to_vec())).collect()
    }

    fn run(files: &HashMap<String, Vec<u8>>, patch: &str) -> Result<Vec<Change>> {
        plan(&parse(patch)?, &|p| Ok(files.get(p).cloned()))
    }

    #[test]
    fn adds_updates_moves_and_deletes_in_one_patch() {
        let files =
            tree(&[("src/lib.rs", "fn a() {\n    x();\n}\n\nfn b() {\n    x();\n}\n"), ("src/old.rs", "gone\n")]);
        let patch = "*** Begin Patch\n*** Add File: src/new.rs\n+fn new() {}\n*** Update File: src/lib.rs\n*** Move to: src/core.rs\n@@ fn b() {\n-    x();\n+    y();\n*** Delete File: src/old.rs\n*** End Patch\n";
        assert!(detect(patch));
        let changes = run(&files, patch).unwrap();
        assert_eq!(
            changes,
            vec![
                Change::Write { path: "src/new.rs".into(), bytes: b"fn new() {}\n".to_vec() },
                Change::Write {
                    path: "src/core.rs".into(),
                    bytes: b"fn a() {\n    x();\n}\n\nfn b() {\n    y();\n}\n".to_vec()
                },
                Change::Delete { path: "src/lib.rs".into() },
                Change::Delete { path: "src/old.rs".into() },
            ]
        );
    }

    #[test]
    fn a_patch_that_does_not_fit_plans_nothing() {
        let files = tree(&[("a.txt", "one\ntwo\n")]);
        let missing = "*** Begin Patch\n*** Update File: a.txt\n@@\n-three\n+3\n*** End Patch";
        assert!(matches!(run(&files, missing), Err(Error::NoMatch { .. })));
        let exists = "*** Begin Patch\n*** Add File: a.txt\n+x\n*** End Patch";
        assert!(run(&files, exists).unwrap_err().to_string().contains("exists already"));
        let cut = "*** Begin Patch\n*** Update File: a.txt\n-one\n+1\n";
        assert!(run(&files, cut).unwrap_err().to_string().contains("End Patch"));
        let escape = "*** Begin Patch\n*** Delete File: ../etc/passwd\n*** End Patch";
        assert!(run(&files, escape).unwrap_err().to_string().contains("inside the workspace"));
        let ok = "*** Begin Patch\n*** Update File: a.txt\n-one\n+1\n two\n*** End Patch";
        assert_eq!(run(&files, ok).unwrap(), vec![Change::Write { path: "a.txt".into(), bytes: b"1\ntwo\n".to_vec() }]);
    }
}
