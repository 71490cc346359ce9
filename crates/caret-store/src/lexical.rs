//! Lexical analysis for the keyed BM25 index: the terms of a chunk of code or prose.
//!
//! Terms are lowercase runs of letters and digits, plus the parts of identifiers split at
//! `snake_case` and `camelCase` boundaries, so `retryFailedUpload` yields `retryfailedupload`,
//! `retry`, `failed` and `upload`. The caller hashes each term with its key before anything
//! is stored.

/// Calls `term` for every term of `text`, in order (repeats included).
pub fn terms(text: &str, mut term: impl FnMut(&str)) {
    let mut lower = String::new();
    for word in text.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        if word.is_empty() {
            continue;
        }
        let parts = split_identifier(word);
        let whole = word.trim_matches('_');
        if !whole.is_empty() {
            lower.clear();
            lower.extend(whole.chars().flat_map(char::to_lowercase));
            term(&lower);
        }
        if parts.len() > 1 {
            for p in parts {
                lower.clear();
                lower.extend(p.chars().flat_map(char::to_lowercase));
                term(&lower);
            }
        }
    }
}

/// Splits an identifier at underscores and lower→upper or letter↔digit boundaries, keeping
/// acronyms together (`HTTPServer` → `HTTP`, `Server`).
fn split_identifier(word: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    for piece in word.split('_').filter(|p| !p.is_empty()) {
        let chars: Vec<(usize, char)> = piece.char_indices().collect();
        let mut start = 0;
        for i in 1..chars.len() {
            let (prev, cur) = (chars[i - 1].1, chars[i].1);
            let next = chars.get(i + 1).map(|c| c.1);
            let boundary = (prev.is_lowercase() && cur.is_uppercase())
                || (prev.is_uppercase() && cur.is_uppercase() && next.is_some_and(char::is_lowercase))
                || (prev.is_alphabetic() != cur.is_alphabetic() && (prev.is_numeric() || cur.is_numeric()));
            if boundary {
                parts.push(&piece[start..chars[i].0]);
                start = chars[i].0;
            }
        }
        parts.push(&piece[start..]);
    }
    parts
}

/// The words of a query that name a symbol rather than describe one: identifiers with an
/// inner underscore or a lower→upper case boundary (`steal_into`, `joinSet`, `HashMap`),
/// lowercased; each segment of a path on its own (`mem::take_while` gives `take_while`).
/// Plain words never count: a question in prose names no symbol.
pub fn symbols(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for word in text.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        let word = word.trim_matches('_');
        let chars: Vec<char> = word.chars().collect();
        let snake = chars.windows(3).any(|w| w[1] == '_' && w[0].is_alphanumeric() && w[2].is_alphanumeric());
        let camel = chars.windows(2).any(|w| w[0].is_lowercase() && w[1].is_uppercase());
        if snake || camel {
            let lower = word.to_lowercase();
            if !out.contains(&lower) {
                out.push(lower);
            }
        }
    }
    out
}

/// A term as a defined name's: kept apart from the same word used in text, so that a query
/// can ask separately for chunks that define what it names.
pub fn definition_term(term: &str) -> String {
    format!("\u{1}def\u{1}{term}")
}

/// Calls `term` with [`definition_term`] of every term of each name in `names` (a name's
/// identifier parts count, so `steal_into` is found for "steal").
pub fn defined_terms(names: &[String], mut term: impl FnMut(&str)) {
    for name in names {
        terms(name, |t| term(&definition_term(t)));
    }
}

/// Term frequencies of `text`, hashed by `hash`, sorted by hash; and the number of terms.
pub fn hashed_terms(text: &str, hash: impl Fn(&str) -> u64) -> (Vec<(u64, u32)>, u32) {
    let mut counts: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
    let mut length = 0u32;
    terms(text, |t| {
        *counts.entry(hash(t)).or_default() += 1;
        length = length.saturating_add(1);
    });
    let mut terms: Vec<(u64, u32)> = counts.into_iter().collect();
    terms.sort_unstable();
    (terms, length)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(text: &str) -> Vec<String> {
        let mut v = Vec::new();
        terms(text, |t| v.push(t.to_owned()));
        v
    }

    #[test]
    fn identifiers_are_split_and_lowercased() {
        assert_eq!(all("retryFailedUpload(x)"), ["retryfailedupload", "retry", "failed", "upload", "x"]);
        assert_eq!(all("MAX_RETRY_COUNT"), ["max_retry_count", "max", "retry", "count"]);
        assert_eq!(all("HTTPServer2 ok"), ["httpserver2", "http", "server", "2", "ok"]);
        assert_eq!(all("  // é café "), ["é", "café"]);
    }

    #[test]
    fn hashed_terms_count_repeats() {
        let (terms, len) = hashed_terms("a b a", |t| t.len() as u64 * 10 + u64::from(t.as_bytes()[0]));
        assert_eq!(len, 3);
        assert_eq!(terms, vec![(107, 2), (108, 1)]);
    }
}
