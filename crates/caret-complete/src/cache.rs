//! The typed-ahead cache: a suggestion shown for one cursor serves the keystrokes that type
//! its first characters. With `foo.bar(` and a suggestion `x, y)`, typing `x` is answered
//! `, y)` from memory, with no request at all.

/// One suggestion remembered.
#[derive(Debug, Clone)]
struct Entry {
    doc: String,
    /// Length of the prefix the suggestion was made for.
    prefix_len: usize,
    /// The end of that prefix (enough to tell one place from another).
    prefix_tail: String,
    /// The rest of the cursor's line after the cursor.
    rest_of_line: String,
    suggestion: String,
}

/// Recent suggestions, newest last; bounded.
#[derive(Debug, Clone)]
pub struct Cache {
    entries: Vec<Entry>,
    capacity: usize,
}

/// How much of a prefix's end identifies it.
const TAIL: usize = 512;

impl Default for Cache {
    fn default() -> Cache {
        Cache::new(64)
    }
}

impl Cache {
    /// A cache holding up to `capacity` suggestions.
    pub fn new(capacity: usize) -> Cache {
        Cache { entries: Vec::new(), capacity: capacity.max(1) }
    }

    /// Remembers `suggestion` for the cursor after `prefix` in document `doc`.
    pub fn put(&mut self, doc: &str, prefix: &str, suffix: &str, suggestion: &str) {
        if suggestion.is_empty() {
            return;
        }
        let tail_start = floor_boundary(prefix, prefix.len().saturating_sub(TAIL));
        let entry = Entry {
            doc: doc.to_owned(),
            prefix_len: prefix.len(),
            prefix_tail: prefix[tail_start..].to_owned(),
            rest_of_line: rest_of_line(suffix).to_owned(),
            suggestion: suggestion.to_owned(),
        };
        self.entries.retain(|e| {
            !(e.doc == entry.doc && e.prefix_len == entry.prefix_len && e.prefix_tail == entry.prefix_tail)
        });
        if self.entries.len() == self.capacity {
            self.entries.remove(0);
        }
        self.entries.push(entry);
    }

    /// What is left of a remembered suggestion for the cursor after `prefix`: the user typed
    /// its first characters (or nothing), the text after the cursor on the line is the same.
    pub fn get(&self, doc: &str, prefix: &str, suffix: &str) -> Option<String> {
        let rest = rest_of_line(suffix);
        self.entries.iter().rev().find_map(|e| {
            if e.doc != doc || e.rest_of_line != rest || prefix.len() < e.prefix_len {
                return None;
            }
            let start = e.prefix_len.checked_sub(e.prefix_tail.len())?;
            if prefix.get(start..e.prefix_len)? != e.prefix_tail {
                return None;
            }
            let typed = prefix.get(e.prefix_len..)?;
            let left = e.suggestion.strip_prefix(typed)?;
            (!left.is_empty()).then(|| left.to_owned())
        })
    }

    /// Forgets everything about a document (closed, or changed somewhere else).
    pub fn forget(&mut self, doc: &str) {
        self.entries.retain(|e| e.doc != doc);
    }
}

fn rest_of_line(suffix: &str) -> &str {
    suffix.split('\n').next().unwrap_or("")
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}
