//! Finding where a block of lines (an anchor) sits in a file, tolerating what models get
//! wrong: trailing whitespace, and indentation (a method quoted without its class's indent).
//!
//! Levels are tried strictest first; the first level with any match decides. One match is
//! the answer; several at that level are ambiguous and reported, never guessed.

use crate::error::excerpt;
use crate::{Error, Result};

/// How closely the anchor matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Byte for byte.
    Exact,
    /// Equal but for trailing whitespace.
    TrailingWhitespace,
    /// Equal but for a consistent indentation shift (and trailing whitespace).
    Indentation,
}

/// How the file's indentation differs from the anchor's at the match.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Shift {
    /// The same.
    #[default]
    None,
    /// The file has this much more at the start of every line.
    Add(String),
    /// The file has this much less.
    Remove(String),
}

impl Shift {
    /// A replacement line re-indented for the file.
    pub fn apply(&self, line: &str) -> String {
        match self {
            _ if line.trim().is_empty() => line.to_owned(),
            Shift::None => line.to_owned(),
            Shift::Add(p) => format!("{p}{line}"),
            Shift::Remove(p) => line.strip_prefix(p.as_str()).unwrap_or(line.trim_start()).to_owned(),
        }
    }
}

/// Where an anchor matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Index of the first matched line.
    pub start: usize,
    /// Lines matched.
    pub len: usize,
    /// How closely.
    pub level: Level,
    /// The indentation difference to carry over to replacement lines.
    pub shift: Shift,
}

fn indent(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// The indentation shift that turns `anchor` into `file`, if one shift fits every non-blank
/// line.
fn shift_between(file: &[&str], anchor: &[&str]) -> Option<Shift> {
    let mut shift: Option<Shift> = None;
    for (f, a) in file.iter().zip(anchor) {
        if a.trim().is_empty() && f.trim().is_empty() {
            continue;
        }
        if f.trim() != a.trim() {
            return None;
        }
        let (fi, ai) = (indent(f), indent(a));
        let this = if fi == ai {
            Shift::None
        } else if let Some(extra) = fi.strip_suffix(ai) {
            Shift::Add(extra.to_owned())
        } else if let Some(less) = ai.strip_suffix(fi) {
            Shift::Remove(less.to_owned())
        } else {
            return None;
        };
        match &shift {
            None => shift = Some(this),
            Some(s) if *s == this => {}
            Some(_) => return None,
        }
    }
    Some(shift.unwrap_or_default())
}

fn fits(level: Level, file: &[&str], anchor: &[&str]) -> Option<Shift> {
    match level {
        Level::Exact => (file == anchor).then_some(Shift::None),
        Level::TrailingWhitespace => {
            file.iter().zip(anchor).all(|(f, a)| f.trim_end() == a.trim_end()).then_some(Shift::None)
        }
        Level::Indentation => shift_between(file, anchor),
    }
}

/// Every place `anchor` matches at `level` in `file[from..]`.
fn all_at(level: Level, file: &[&str], anchor: &[&str], from: usize) -> Vec<Found> {
    let n = anchor.len();
    if n == 0 || file.len() < n {
        return Vec::new();
    }
    // The first non-blank anchor line filters candidates cheaply.
    let key = anchor.iter().position(|l| !l.trim().is_empty()).unwrap_or(0);
    let key_text = anchor[key].trim();
    (from..=file.len() - n)
        .filter(|&i| match level {
            Level::Exact => file[i + key] == anchor[key],
            _ => file[i + key].trim() == key_text,
        })
        .filter_map(|i| fits(level, &file[i..i + n], anchor).map(|shift| Found { start: i, len: n, level, shift }))
        .collect()
}

/// Finds the one place `anchor` belongs in `file`, searching from line index `from`.
pub fn find(file: &[&str], anchor: &[&str], from: usize) -> Result<Found> {
    find_near(file, anchor, from, None)
}

/// Like [`find`]; when several places match equally well, the one nearest line index `hint`
/// (a diff's line number) wins if it is strictly the nearest.
pub fn find_near(file: &[&str], anchor: &[&str], from: usize, hint: Option<usize>) -> Result<Found> {
    if anchor.iter().all(|l| l.trim().is_empty()) {
        return Err(Error::Malformed("an anchor has no text to look for".to_owned()));
    }
    for level in [Level::Exact, Level::TrailingWhitespace, Level::Indentation] {
        match all_at(level, file, anchor, from).as_slice() {
            [] => continue,
            [one] => return Ok(one.clone()),
            many => {
                if let Some(h) = hint {
                    let mut by_distance: Vec<&Found> = many.iter().collect();
                    by_distance.sort_by_key(|f| f.start.abs_diff(h));
                    if by_distance[0].start.abs_diff(h) < by_distance[1].start.abs_diff(h) {
                        return Ok(by_distance[0].clone());
                    }
                }
                return Err(Error::Ambiguous {
                    anchor: excerpt(anchor),
                    lines: many.iter().map(|f| f.start + 1).collect(),
                });
            }
        }
    }
    Err(Error::NoMatch { anchor: excerpt(anchor) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &[&str] = &[
        "struct A;",
        "impl A {",
        "    fn a(&self) -> u32 {",
        "        1",
        "    }",
        "",
        "    fn b(&self) -> u32 {   ",
        "        2",
        "    }",
        "}",
    ];

    #[test]
    fn strictest_level_first_and_indentation_carried_over() {
        let f = find(FILE, &["    fn a(&self) -> u32 {", "        1"], 0).unwrap();
        assert_eq!((f.start, f.level), (2, Level::Exact));
        let f = find(FILE, &["    fn b(&self) -> u32 {", "        2"], 0).unwrap();
        assert_eq!((f.start, f.level), (6, Level::TrailingWhitespace));
        // Quoted without the impl's indentation.
        let f = find(FILE, &["fn a(&self) -> u32 {", "    1", "}"], 0).unwrap();
        assert_eq!((f.start, f.level, &f.shift), (2, Level::Indentation, &Shift::Add("    ".to_owned())));
        assert_eq!(f.shift.apply("    2"), "        2");
        // Inconsistent indentation is not a match.
        assert!(matches!(find(FILE, &["fn a(&self) -> u32 {", "        1"], 0), Err(Error::NoMatch { .. })));
    }

    #[test]
    fn two_equal_places_are_reported_not_guessed() {
        let err = find(FILE, &["    }"], 0).unwrap_err();
        assert_eq!(err, Error::Ambiguous { anchor: "    }".to_owned(), lines: vec![5, 9] });
        assert!(err.to_string().contains("lines 5, 9"), "{err}");
        // A later start narrows it.
        assert_eq!(find(FILE, &["    }"], 6).unwrap().start, 8);
        assert!(matches!(find(FILE, &["nope"], 0), Err(Error::NoMatch { .. })));
        assert!(matches!(find(FILE, &["", " "], 0), Err(Error::Malformed(_))));
    }
}
