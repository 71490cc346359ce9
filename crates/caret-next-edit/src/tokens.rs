//! The tokens the rules match edits by: a quoted literal on one line, a run of word
//! characters (a name or a number), or one other character; white space is no token.

use std::collections::HashMap;

/// What a token is, for telling which may stand for which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Name,
    Number,
    Text,
    Other,
}

/// Tokens of `s` with their byte spans: a quoted literal on one line (`"…"`, `'…'`, `` `…` ``,
/// escapes honoured), a run of word characters, or one other character; white space is no
/// token. A quote with no closing one on its line is a character of its own (a Rust
/// lifetime's `'a`).
pub(crate) fn tokens(s: &str) -> Vec<(usize, usize, Kind)> {
    let b = s.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if matches!(c, b'"' | b'\'' | b'`') {
            let mut j = i + 1;
            while j < b.len() && b[j] != c && b[j] != b'\n' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            if j < b.len() && b[j] == c {
                out.push((i, j + 1, Kind::Text));
                i = j + 1;
                continue;
            }
        }
        if word(c) {
            let mut j = i;
            while j < b.len() && word(b[j]) {
                j += 1;
            }
            let kind = if c.is_ascii_digit() { Kind::Number } else { Kind::Name };
            out.push((i, j, kind));
            i = j;
            continue;
        }
        // One character, however many bytes (`word` took every byte of 0x80 and up).
        out.push((i, i + 1, Kind::Other));
        i += 1;
    }
    out
}

/// `text` with each whole token that `map` names replaced.
pub(crate) fn put_in(text: &str, map: &HashMap<&str, &str>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (s, e, _) in tokens(text) {
        if let Some(to) = map.get(&text[s..e]) {
            out.push_str(&text[at..s]);
            out.push_str(to);
            at = e;
        }
    }
    out.push_str(&text[at..]);
    out
}
