//! Search/replace blocks:
//!
//! ```text
//! <<<<<<< SEARCH
//! lines as they are in the file
//! =======
//! the lines to put there instead
//! >>>>>>> REPLACE
//! ```
//!
//! Any number of blocks, applied in order; text outside blocks (prose, a file name, code
//! fences) is ignored. An empty SEARCH appends the replacement (or creates the file's text).
//!
//! When an edit has no such block, the looser conflict-marker form is read the same way:
//! exactly seven `<` then anything (`<<<<<<< src/lib.rs`, `<<<<<<< HEAD`), `=======`, exactly
//! seven `>` then anything. Small models write it that way more often than not.

use crate::matcher::find;
use crate::text::edit_lines;
use crate::{Error, Result, Text};

/// One block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The lines to find.
    pub search: Vec<String>,
    /// The lines to put instead.
    pub replace: Vec<String>,
}

fn marker(line: &str, ch: char, word: &str) -> bool {
    let t = line.trim();
    let run = t.chars().take_while(|c| *c == ch).count();
    run >= 5 && t[run..].trim() == word
}

/// A conflict marker: exactly seven `ch`, then nothing or a space and anything.
fn loose(line: &str, ch: char) -> bool {
    let t = line.trim();
    let run = t.chars().take_while(|c| *c == ch).count();
    run == 7 && (t.len() == 7 || t[7..].starts_with(char::is_whitespace))
}

fn open_strict(line: &str) -> bool {
    marker(line, '<', "SEARCH")
}

fn close_strict(line: &str) -> bool {
    marker(line, '>', "REPLACE")
}

fn open_loose(line: &str) -> bool {
    loose(line, '<')
}

fn close_loose(line: &str) -> bool {
    loose(line, '>')
}

/// Whether text looks like search/replace blocks (either form).
pub fn detect(edit: &str) -> bool {
    (edit.lines().any(open_strict) && edit.lines().any(close_strict)) || detect_loose(edit)
}

/// The conflict-marker form: an opening line, then `=======`, then a closing line, in order.
fn detect_loose(edit: &str) -> bool {
    let mut lines = edit.lines();
    lines.any(open_loose) && lines.any(|l| l.trim() == "=======") && lines.any(close_loose)
}

/// Parses every block of an edit.
pub fn parse(edit: &str) -> Result<Vec<Block>> {
    let lines = edit_lines(edit);
    let blocks = parse_with(&lines, open_strict, close_strict)?;
    if !blocks.is_empty() {
        return Ok(blocks);
    }
    let blocks = parse_with(&lines, open_loose, close_loose)?;
    if blocks.is_empty() {
        return Err(Error::Malformed("no <<<<<<< SEARCH … >>>>>>> REPLACE block".to_owned()));
    }
    Ok(blocks)
}

fn parse_with(lines: &[&str], open: fn(&str) -> bool, close: fn(&str) -> bool) -> Result<Vec<Block>> {
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !open(lines[i]) {
            i += 1;
            continue;
        }
        let opened = i + 1;
        // Exactly seven: longer runs of `=` are text (reStructuredText and Markdown underlines).
        let sep = (opened..lines.len())
            .find(|&j| lines[j].trim() == "=======")
            .ok_or_else(|| Error::Malformed(format!("the SEARCH at line {opened} has no ======= line")))?;
        let end = (sep + 1..lines.len())
            .find(|&j| close(lines[j]))
            .ok_or_else(|| Error::Malformed(format!("the SEARCH at line {opened} has no >>>>>>> REPLACE line")))?;
        if let Some(j) = (opened..sep).chain(sep + 1..end).find(|&j| open(lines[j])) {
            return Err(Error::Malformed(format!("a SEARCH at line {} opens inside another block", j + 1)));
        }
        let own = |r: std::ops::Range<usize>| lines[r].iter().map(|l| (*l).to_owned()).collect();
        blocks.push(Block { search: own(opened..sep), replace: own(sep + 1..end) });
        i = end + 1;
    }
    Ok(blocks)
}

/// How many blank lines a block's search has at its start and its end.
fn blank_edges(lines: &[String]) -> (usize, usize) {
    let blank = |l: &&String| l.trim().is_empty();
    let lead = lines.iter().take_while(blank).count();
    (lead, lines[lead..].iter().rev().take_while(blank).count())
}

/// Applies blocks to a file, in order. Blank lines at the edges of a search are not anchors:
/// the rest is found, and the blank lines are replaced too where the file has them next to
/// it (a block that drops a blank line drops it); where it has not (a model's padding), as
/// many blank lines are taken off the replacement's edge when it has them.
pub fn apply(text: &Text, blocks: &[Block]) -> Result<Text> {
    let mut out = text.clone();
    for block in blocks {
        let (lead, trail) = blank_edges(&block.search);
        let search: Vec<&str> = block.search[lead..block.search.len() - trail].iter().map(String::as_str).collect();
        // The replacement without as many blank lines at each edge as the search quotes
        // there and the file does not hold.
        let (r_lead, r_trail) = blank_edges(&block.replace);
        let trimmed = |takes_lead: bool, takes_trail: bool| {
            let cut_lead = if takes_lead { 0 } else { r_lead.min(lead) };
            let cut_trail = if takes_trail { 0 } else { r_trail.min(trail).min(block.replace.len() - cut_lead) };
            &block.replace[cut_lead..block.replace.len() - cut_trail]
        };
        if search.is_empty() {
            out.lines.extend(trimmed(false, false).iter().cloned());
            continue;
        }
        let file = out.line_refs();
        let found = match find(&file, &search, 0) {
            // Two places without the blank edges: the edges may tell them apart.
            Err(ambiguous @ Error::Ambiguous { .. }) if lead + trail > 0 => {
                let whole: Vec<&str> = block.search.iter().map(String::as_str).collect();
                let Ok(found) = find(&file, &whole, 0) else { return Err(ambiguous) };
                let new: Vec<String> = block.replace.iter().map(|l| found.shift.apply(l)).collect();
                out.lines.splice(found.start..found.start + found.len, new);
                continue;
            }
            found => found?,
        };
        let blank = |j: usize| file.get(j).is_some_and(|l| l.trim().is_empty());
        let end = found.start + found.len;
        let takes_lead = found.start >= lead && (1..=lead).all(|k| blank(found.start - k));
        let takes_trail = (0..trail).all(|k| blank(end + k));
        let new: Vec<String> = trimmed(takes_lead, takes_trail).iter().map(|l| found.shift.apply(l)).collect();
        let start = if takes_lead { found.start - lead } else { found.start };
        let end = if takes_trail { end + trail } else { end };
        out.lines.splice(start..end, new);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "fn main() {\r\n    let x = 1;\r\n    println!(\"{x}\");\r\n}\r\n\r\nfn other() {}";

    #[test]
    fn blocks_apply_in_order_and_keep_the_files_endings() {
        let edit = "Here is the change:\n\nsrc/main.rs\n```rust\n<<<<<<< SEARCH\n    let x = 1;\n=======\n    let x = 2;\n    let y = 3;\n>>>>>>> REPLACE\n```\n\n<<<<<<< SEARCH\nfn other() {}\n=======\n>>>>>>> REPLACE\n";
        assert!(detect(edit));
        let blocks = parse(edit).unwrap();
        assert_eq!(blocks.len(), 2);
        let out = apply(&Text::new(FILE), &blocks).unwrap().render();
        assert_eq!(out, "fn main() {\r\n    let x = 2;\r\n    let y = 3;\r\n    println!(\"{x}\");\r\n}\r\n");
        let out = Text::new(FILE);
        assert!(!out.final_newline, "the file had none, and keeps none");
    }

    #[test]
    fn indentation_is_carried_over_and_blank_edges_are_not_anchors() {
        let file = Text::new("impl A {\n    fn a() {\n        old();\n    }\n}\n");
        let blocks = parse("<<<<<<< SEARCH\n\nfn a() {\n    old();\n}\n\n=======\n\nfn a() {\n    new();\n    more();\n}\n\n>>>>>>> REPLACE\n").unwrap();
        let out = apply(&file, &blocks).unwrap().render();
        assert_eq!(out, "impl A {\n    fn a() {\n        new();\n        more();\n    }\n}\n");
    }

    #[test]
    fn blank_lines_a_block_quotes_and_the_file_holds_are_replaced_too() {
        // The block drops the blank line after the version: the file loses it.
        let file = Text::new("__version__ = '3.8'\n\n");
        let blocks =
            parse("<<<<<<< SEARCH\n__version__ = '3.8'\n\n=======\n__version__ = \"3.9\"\n>>>>>>> REPLACE\n").unwrap();
        assert_eq!(apply(&file, &blocks).unwrap().render(), "__version__ = \"3.9\"\n");
        // Blank lines the file has not there are a model's padding: nothing else changes.
        let file = Text::new("a = 1\nb = 2\n");
        let blocks = parse("<<<<<<< SEARCH\n\na = 1\n\n=======\n\na = 3\n\n>>>>>>> REPLACE\n").unwrap();
        assert_eq!(apply(&file, &blocks).unwrap().render(), "a = 3\nb = 2\n");
    }

    #[test]
    fn malformed_missing_and_ambiguous_blocks_are_errors() {
        assert!(matches!(parse("no blocks"), Err(Error::Malformed(_))));
        assert!(matches!(parse("<<<<<<< SEARCH\na\n>>>>>>> REPLACE\n"), Err(Error::Malformed(_))));
        assert!(matches!(parse("<<<<<<< SEARCH\na\n=======\nb\n"), Err(Error::Malformed(_))));
        // An underline in the text is not the separator.
        let rst = parse("<<<<<<< SEARCH\nTitle\n=========\n=======\nNew title\n=========\n>>>>>>> REPLACE").unwrap();
        assert_eq!(rst[0].search, ["Title", "========="]);
        let file = Text::new("a\nb\na\n");
        let amb = parse("<<<<<<< SEARCH\na\n=======\nc\n>>>>>>> REPLACE").unwrap();
        assert!(matches!(apply(&file, &amb), Err(Error::Ambiguous { .. })));
        // Blank edges that tell two places apart are anchors after all.
        let file = Text::new("a\nb\n\nb\n\na\nb\n");
        let edges = parse("<<<<<<< SEARCH\n\na\nb\n=======\n\nc\n>>>>>>> REPLACE").unwrap();
        assert_eq!(apply(&file, &edges).unwrap().render(), "a\nb\n\nb\n\nc\n");
        let file = Text::new("a\nb\na\n");
        let miss = parse("<<<<<<< SEARCH\nz\n=======\nc\n>>>>>>> REPLACE").unwrap();
        assert!(matches!(apply(&file, &miss), Err(Error::NoMatch { .. })));
        let append = parse("<<<<<<< SEARCH\n=======\nd\n>>>>>>> REPLACE").unwrap();
        assert_eq!(apply(&file, &append).unwrap().render(), "a\nb\na\nd\n");
    }

    #[test]
    fn the_conflict_marker_form_is_read_when_no_strict_block_is_there() {
        let edit = "<<<<<<< src/lib.rs\nfn double(x: i32) -> i32 {\n    x * 3\n}\n=======\nfn double(x: i32) -> i32 {\n    x * 2\n}\n>>>>>>> fixed\n";
        assert!(detect(edit));
        assert_eq!(crate::Format::detect(edit), Some(crate::Format::SearchReplace));
        let file = Text::new("// math\nfn double(x: i32) -> i32 {\n    x * 3\n}\n");
        let out = apply(&file, &parse(edit).unwrap()).unwrap().render();
        assert_eq!(out, "// math\nfn double(x: i32) -> i32 {\n    x * 2\n}\n");
        let bare = parse("<<<<<<<\na\n=======\nb\n>>>>>>>\n").unwrap();
        assert_eq!((bare[0].search.clone(), bare[0].replace.clone()), (vec!["a".to_owned()], vec!["b".to_owned()]));
        // Eight markers are text, not a conflict marker; a strict block wins over loose ones.
        assert!(!detect("<<<<<<<< x\na\n=======\nb\n>>>>>>>> y\n"));
        let strict = parse("<<<<<<< SEARCH\n<<<<<<< a\n=======\nb\n>>>>>>> REPLACE\n").unwrap();
        assert_eq!(strict[0].search, ["<<<<<<< a"]);
        // Out of order is not the form.
        assert!(!detect(">>>>>>> a\n=======\n<<<<<<< b\n"));
    }
}
