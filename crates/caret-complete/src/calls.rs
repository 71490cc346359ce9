//! A next edit of its own kind: a signature's change carried to its call sites. When the last
//! edit added a trailing parameter to a function's definition (`def area(w, h)` →
//! `def area(w, h, unit)`), each call of that function (`area(3, 4)`) is predicted to take the
//! same text before its closing parenthesis (`area(3, 4, unit)`), in the file and in other open
//! files — the argument named as the parameter, for the user to keep or change. Calls that have
//! it already, or more arguments than the old signature, are left alone.

use crate::next_edit::{Edit, Prediction, Why};

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The byte just past the parenthesis that closes the one at `open` (strings and nested
/// brackets skipped), when it closes within 2,000 bytes.
fn closing(text: &str, open: usize) -> Option<usize> {
    let end = crate::plan::floor_boundary(text, open + 2001);
    crate::post::unbalanced_close(&text[open + 1..end]).map(|i| open + 1 + i + 1)
}

/// Top-level arguments between `(` at `open` and `)` before `close`.
fn arguments(text: &str, open: usize, close: usize) -> usize {
    let inner = text[open + 1..close - 1].trim();
    if inner.is_empty() {
        return 0;
    }
    let (mut depth, mut n) = (0i32, 1);
    for c in inner.chars() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => n += 1,
            _ => {}
        }
    }
    n
}

/// The function whose definition's parameter list the insertion `last` extended at its end:
/// its name, and how many parameters it had before.
fn extended_signature<'a>(last: &Edit, text: &'a str) -> Option<(&'a str, usize)> {
    let added = last.new.trim_start();
    if !last.old.is_empty() || !added.starts_with(',') || last.new.contains('\n') || last.new.len() > 120 {
        return None;
    }
    let line_start = text[..last.start].rfind('\n').map_or(0, |i| i + 1);
    let head = &text[line_start..last.start];
    let open = line_start + head.rfind('(')?;
    let before = text[line_start..open].trim_end();
    let name_start = before.rfind(|c: char| !is_word(c)).map_or(0, |i| i + 1);
    let name = &before[name_start..];
    let keyword = before[..name_start].trim_end();
    let defines = ["def", "fn", "function", "func"].iter().any(|k| keyword.ends_with(k))
        || keyword.ends_with("async def")
        || keyword.ends_with("pub fn");
    if name.is_empty() || !defines {
        return None;
    }
    // The insertion ends the parameter list: what follows it closes the parenthesis.
    let after = text[last.start + last.new.len()..].trim_start();
    if !after.starts_with(')') {
        return None;
    }
    let close = closing(text, open)?;
    let params = arguments(text, open, close);
    Some((name, params.saturating_sub(1)))
}

/// What a call takes for the parameter `added` (`, unit`, `, h: u32`): its name; none for a
/// parameter with a default value, which calls need not pass.
fn argument(added: &str) -> Option<String> {
    let param = added.trim_start().strip_prefix(',')?.trim_start();
    let param = param.strip_prefix("mut ").unwrap_or(param);
    let name: String = param.chars().take_while(|c| is_word(*c)).collect();
    (!name.is_empty() && !param.contains('=')).then(|| format!(", {name}"))
}

/// The calls of the function whose signature `last` extended, in `text` (the current text of
/// `path`) and in `others` (other open files: path and text), each to take the added text.
pub fn call_sites(last: &Edit, path: &str, text: &str, others: &[(&str, &str)]) -> Vec<Prediction> {
    let Some((name, params)) = extended_signature(last, text) else { return Vec::new() };
    let Some(added) = argument(&last.new) else { return Vec::new() };
    let def_line = text[..last.start].matches('\n').count();
    let mut out = Vec::new();
    let files = std::iter::once((path, text)).chain(others.iter().copied().filter(|(p, _)| *p != path));
    for (file, body) in files {
        for (at, _) in body.match_indices(name) {
            let open = at + name.len();
            let glued = body[..at].chars().next_back().is_some_and(is_word);
            if glued || !body[open..].starts_with('(') || file == path && body[..at].matches('\n').count() == def_line {
                continue;
            }
            // A definition elsewhere (another overload, a method of that name) is no call.
            let line = &body[body[..at].rfind('\n').map_or(0, |i| i + 1)..at];
            if ["def ", "fn ", "function ", "func "].iter().any(|k| line.trim_end().ends_with(k.trim_end())) {
                continue;
            }
            let Some(close) = closing(body, open) else { continue };
            let has = body[open..close - 1].trim_end().ends_with(added.trim_start_matches(", "));
            if arguments(body, open, close) != params || has {
                continue;
            }
            out.push(Prediction {
                path: file.to_owned(),
                start: close - 1,
                end: close - 1,
                replacement: added.clone(),
                why: Why::Insert,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::next_edit::edit_of;

    #[test]
    fn a_parameter_added_to_a_definition_goes_to_its_calls() {
        let before = "def area(w, h):\n    return w * h\n\nprint(area(3, 4))\nx = area(len(s), f(1, 2))\n";
        let after = "def area(w, h, unit):\n    return w * h\n\nprint(area(3, 4))\nx = area(len(s), f(1, 2))\n";
        let last = edit_of("geo.py", before, after);
        let other = "from geo import area\nareas = [area(1, 2), area(1, 2, unit), subarea(1, 2)]\n";
        let found = call_sites(&last, "geo.py", after, &[("use.py", other)]);
        let applied: Vec<String> = found
            .iter()
            .map(|p| {
                let body = if p.path == "geo.py" { after } else { other };
                let line_start = body[..p.start].rfind('\n').map_or(0, |i| i + 1);
                let line_end = body[p.start..].find('\n').map_or(body.len(), |i| p.start + i);
                format!("{}: {}", p.path, &p.apply(body)[line_start..line_end + p.replacement.len()])
            })
            .collect();
        assert_eq!(
            applied,
            [
                "geo.py: print(area(3, 4, unit))",
                "geo.py: x = area(len(s), f(1, 2), unit)",
                "use.py: areas = [area(1, 2, unit), area(1, 2, unit), subarea(1, 2)]",
            ],
            "the call that has it already, and another function, are left alone"
        );
        assert!(found.iter().all(|p| p.why == Why::Insert));
    }

    #[test]
    fn only_a_definitions_parameter_list_counts() {
        // An argument added to a call is not a signature change.
        let before = "print(area(3, 4))\n";
        let after = "print(area(3, 4, 5))\n";
        let last = edit_of("a.py", before, after);
        assert!(call_sites(&last, "a.py", after, &[]).is_empty());
        // Rust: `fn` and `pub fn`.
        let before = "pub fn area(w: u32) -> u32 { w }\nlet a = area(3);\n";
        let after = "pub fn area(w: u32, h: u32) -> u32 { w }\nlet a = area(3);\n";
        let last = edit_of("a.rs", before, after);
        let found = call_sites(&last, "a.rs", after, &[]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].apply(after).lines().nth(1), Some("let a = area(3, h);"), "the name, not the type");
        // A parameter with a default: calls need not change.
        let before = "def f(a):\n    pass\nf(1)\n";
        let after = "def f(a, b=2):\n    pass\nf(1)\n";
        assert!(call_sites(&edit_of("d.py", before, after), "d.py", after, &[]).is_empty());
    }
}
