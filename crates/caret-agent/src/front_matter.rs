//! The YAML front matter of Markdown files that agents share (rules, skills, commands,
//! subagents): `---` lines around `key: value` pairs, with the forms those files use — quoted
//! values, `[a, b]` lists, `- item` lists, and `|`/`>` blocks. Not a YAML parser: what it does
//! not read it leaves out, and the file's body still counts.

/// `(front matter, body)`; no front matter: `("", raw)`.
pub fn split(raw: &str) -> (&str, &str) {
    let text = raw.strip_prefix('\u{feff}').unwrap_or(raw);
    let Some(rest) = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n")) else { return ("", text) };
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return (&rest[..offset], &rest[offset + line.len()..]);
        }
        offset += line.len();
    }
    ("", text)
}

/// `s` without the quotes around it.
pub fn unquote(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .or_else(|| s.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')))
        .unwrap_or(s)
}

/// A front-matter value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// One line (or a `|`/`>` block joined).
    Text(String),
    /// `[a, b]` or `- a` lines.
    List(Vec<String>),
}

impl Value {
    /// The text (a list's items joined with `, `).
    pub fn text(&self) -> String {
        match self {
            Value::Text(t) => t.clone(),
            Value::List(items) => items.join(", "),
        }
    }

    /// The items (a text split at commas).
    pub fn items(&self) -> Vec<String> {
        match self {
            Value::List(items) => items.clone(),
            Value::Text(t) => t.split(',').map(|s| unquote(s).to_owned()).filter(|s| !s.is_empty()).collect(),
        }
    }
}

/// The `key: value` pairs of a front matter, in order.
pub fn fields(front: &str) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = Vec::new();
    let lines: Vec<&str> = front.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        if line.starts_with([' ', '\t']) || line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else { continue };
        let (key, value) = (key.trim().to_owned(), value.trim());
        // The indented lines under it.
        let start = i;
        while i < lines.len() && (lines[i].starts_with([' ', '\t']) || lines[i].trim().is_empty()) {
            i += 1;
        }
        let under: Vec<&str> = lines[start..i].iter().map(|l| l.trim()).collect();
        let value = if value.is_empty() && under.iter().any(|l| l.starts_with("- ") || *l == "-") {
            Value::List(under.iter().filter_map(|l| l.strip_prefix('-')).map(|l| unquote(l).to_owned()).collect())
        } else if let Some(block) = value.strip_prefix('|').or_else(|| value.strip_prefix('>')) {
            let joiner = if value.starts_with('|') { "\n" } else { " " };
            let _ = block;
            Value::Text(under.iter().filter(|l| !l.is_empty()).copied().collect::<Vec<_>>().join(joiner))
        } else if let Some(list) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
            Value::List(list.split(',').map(|s| unquote(s).to_owned()).filter(|s| !s.is_empty()).collect())
        } else {
            Value::Text(unquote(value).to_owned())
        };
        out.push((key, value));
    }
    out
}

/// The value of `key` in `fields`.
pub fn get<'a>(fields: &'a [(String, Value)], key: &str) -> Option<&'a Value> {
    fields.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_agents_files_use() {
        let raw = "---\nname: pdf-tools\ndescription: >-\n  Extract text and tables\n  from PDF files.\n\
                   allowed-tools: [Read, \"Bash(python3:*)\"]\ntools:\n  - Read\n  - Grep\nmodel: 'sonnet'\n\
                   # a comment\nargument-hint: [file]\n---\nBody here.\n";
        let (front, body) = split(raw);
        assert_eq!(body, "Body here.\n");
        let f = fields(front);
        assert_eq!(get(&f, "name"), Some(&Value::Text("pdf-tools".into())));
        assert_eq!(get(&f, "description").unwrap().text(), "Extract text and tables from PDF files.");
        assert_eq!(get(&f, "allowed-tools").unwrap().items(), vec!["Read", "Bash(python3:*)"]);
        assert_eq!(get(&f, "tools").unwrap().items(), vec!["Read", "Grep"]);
        assert_eq!(get(&f, "model").unwrap().text(), "sonnet");
        assert_eq!(get(&f, "argument-hint").unwrap().items(), vec!["file"]);
        assert_eq!(split("no front matter"), ("", "no front matter"));
        assert_eq!(split("---\nunclosed: yes\n"), ("", "---\nunclosed: yes\n"));
    }
}
