//! A text file as lines, remembering how it was written: line endings, final newline, BOM.

use crate::{Error, Result};

/// A file's line ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eol {
    /// `\n`.
    Lf,
    /// `\r\n`.
    CrLf,
}

impl Eol {
    /// The ending's bytes.
    pub fn as_str(self) -> &'static str {
        match self {
            Eol::Lf => "\n",
            Eol::CrLf => "\r\n",
        }
    }
}

/// A text file split into lines (without their endings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text {
    /// The lines.
    pub lines: Vec<String>,
    /// The ending written between lines (the file's majority).
    pub eol: Eol,
    /// Whether the last line ends with a newline.
    pub final_newline: bool,
    /// Whether the file starts with a UTF-8 byte-order mark.
    pub bom: bool,
}

impl Text {
    /// Reads UTF-8 bytes; a NUL byte or invalid UTF-8 is not text.
    pub fn parse(bytes: &[u8]) -> Result<Text> {
        if bytes.contains(&0) {
            return Err(Error::NotText("it contains NUL bytes".to_owned()));
        }
        let s = std::str::from_utf8(bytes).map_err(|e| Error::NotText(format!("invalid UTF-8: {e}")))?;
        Ok(Text::new(s))
    }

    /// Splits a string (already decoded).
    pub fn new(s: &str) -> Text {
        let (bom, s) = match s.strip_prefix('\u{feff}') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let crlf = s.matches("\r\n").count();
        let lf = s.matches('\n').count() - crlf;
        let eol = if crlf > lf { Eol::CrLf } else { Eol::Lf };
        let final_newline = s.ends_with('\n');
        let body = s.strip_suffix('\n').map_or(s, |b| b.strip_suffix('\r').unwrap_or(b));
        let lines = if s.is_empty() {
            Vec::new()
        } else {
            // A carriage return is a line ending only before a newline: one that ends the
            // file is the last line's own (dropping it would change an unchanged file).
            let mut lines: Vec<String> = body.split('\n').map(str::to_owned).collect();
            let last = lines.len() - 1;
            for (i, l) in lines.iter_mut().enumerate() {
                if (i < last || final_newline) && l.ends_with('\r') {
                    l.pop();
                }
            }
            lines
        };
        Text { lines, eol, final_newline, bom }
    }

    /// Writes the lines back with the file's ending, final newline and BOM.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(self.lines.iter().map(|l| l.len() + 2).sum::<usize>() + 3);
        if self.bom {
            out.push('\u{feff}');
        }
        for (i, line) in self.lines.iter().enumerate() {
            if i > 0 {
                out.push_str(self.eol.as_str());
            }
            out.push_str(line);
        }
        if self.final_newline && !self.lines.is_empty() {
            out.push_str(self.eol.as_str());
        }
        out
    }

    /// The lines as string slices.
    pub fn line_refs(&self) -> Vec<&str> {
        self.lines.iter().map(String::as_str).collect()
    }
}

/// Splits an edit's text into lines (any ending), dropping one final empty line.
pub(crate) fn edit_lines(s: &str) -> Vec<&str> {
    let s = s.strip_suffix('\n').map_or(s, |b| b.strip_suffix('\r').unwrap_or(b));
    if s.is_empty() {
        return Vec::new();
    }
    s.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).collect()
}

/// Lines added and removed between two versions (a multiset difference: cheap, and exact for
/// the counts a summary needs).
pub fn line_counts(old: &[String], new: &[String]) -> (usize, usize) {
    let mut counts: std::collections::HashMap<&str, isize> = std::collections::HashMap::new();
    for l in old {
        *counts.entry(l).or_default() -= 1;
    }
    for l in new {
        *counts.entry(l).or_default() += 1;
    }
    let added = counts.values().filter(|c| **c > 0).map(|c| c.unsigned_abs()).sum();
    let removed = counts.values().filter(|c| **c < 0).map(|c| c.unsigned_abs()).sum();
    (added, removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_carriage_return_that_ends_the_file_is_kept() {
        for s in ["a\r", "a\nb\r", "a\r\nb\r", "\r"] {
            assert_eq!(Text::new(s).render(), s, "{s:?}");
        }
        assert_eq!(Text::new("a\r\nb\r\n").lines, ["a", "b"]);
    }

    #[test]
    fn round_trips_endings_final_newline_and_bom() {
        for s in ["a\nb\n", "a\nb", "a\r\nb\r\n", "a\r\nb", "\u{feff}x\r\ny\r\n", "", "\n", "one", "a\n\nb\n\n"] {
            assert_eq!(Text::new(s).render(), s, "{s:?}");
        }
        let t = Text::new("a\r\nb\r\nc\n");
        assert_eq!(t.eol, Eol::CrLf);
        assert_eq!(t.lines, ["a", "b", "c"]);
        assert!(Text::parse(b"a\0b").is_err());
        assert!(Text::parse(&[0xff, 0xfe, b'a']).is_err());
    }
}
