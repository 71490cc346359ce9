//! Syntax-aware chunking, bounded in tokens of the embedding model.
//!
//! A file is parsed with tree-sitter and cut along its syntax tree: consecutive small siblings
//! are grouped into one chunk, a definition (function, class, impl…) prefers to start a new
//! chunk together with the comments and attributes just above it, and a node too large for
//! the budget is cut along its own children, its header (`impl Foo for Bar {`,
//! `def method(self):`) becoming the context of the chunks inside it. Markdown is cut by
//! headings, other text by paragraphs, and anything still too large by lines and then by
//! words. Chunks cover whole lines except when a single line is over budget.
//!
//! Everything here is a pure function of the text: no IO.

mod lang;

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

pub use lang::{FileKind, Language};

use crate::tokens::TokenCounter;
use crate::{ContentHash, RelPath};

/// Chunk size limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkConfig {
    /// Largest chunk in model tokens, context and special tokens included.
    pub max_tokens: usize,
    /// Chunks smaller than this merge with a neighbour where they fit.
    pub min_tokens: usize,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        // all-MiniLM-L6-v2 embeds at most 256 word pieces.
        ChunkConfig { max_tokens: 256, min_tokens: 48 }
    }
}

/// A piece of a file, the unit that is embedded and searched.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Chunk {
    /// The file it comes from.
    pub path: RelPath,
    /// The file's language.
    pub language: Language,
    /// What the file is for.
    pub kind: FileKind,
    /// Byte range in the file.
    pub bytes: Range<usize>,
    /// First line, 1-based.
    pub start_line: u32,
    /// Last line, 1-based, inclusive.
    pub end_line: u32,
    /// Headers of the enclosing scopes, outermost first (e.g. `impl Scanner {`).
    pub context: Vec<String>,
    /// Size in model tokens, context and special tokens included.
    pub tokens: u32,
    /// BLAKE3 of the embedded input (context and text): the embedding cache key.
    pub hash: ContentHash,
    /// Names of the definitions (functions, types, modules…) whose name is in this chunk, in
    /// order: what the chunk defines rather than uses.
    pub defines: Vec<String>,
}

impl Chunk {
    /// The chunk's text within the file's text.
    pub fn text<'t>(&self, file_text: &'t str) -> &'t str {
        file_text.get(self.bytes.clone()).unwrap_or_default()
    }

    /// What gets embedded: the context lines, then the text.
    pub fn embedding_input(&self, file_text: &str) -> String {
        let mut s = String::new();
        for c in &self.context {
            s.push_str(c);
            s.push('\n');
        }
        s.push_str(self.text(file_text));
        s
    }
}

/// Splits files into chunks.
#[derive(Clone)]
pub struct Chunker {
    config: ChunkConfig,
    counter: Arc<dyn TokenCounter>,
}

impl std::fmt::Debug for Chunker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunker").field("config", &self.config).field("counter", &self.counter.id()).finish()
    }
}

thread_local! {
    static PARSERS: RefCell<HashMap<Language, tree_sitter::Parser>> = RefCell::new(HashMap::new());
}

impl Chunker {
    /// A chunker with the given limits, counting with `counter`.
    pub fn new(config: ChunkConfig, counter: Arc<dyn TokenCounter>) -> Self {
        let config = ChunkConfig {
            max_tokens: config.max_tokens.max(counter.special_tokens() + 8),
            min_tokens: config.min_tokens.min(config.max_tokens / 2),
        };
        Chunker { config, counter }
    }

    /// A stable description of everything that decides chunk boundaries.
    pub fn fingerprint(&self) -> String {
        format!("chunker-v4/{}/{}/{}", self.config.max_tokens, self.config.min_tokens, self.counter.id())
    }

    /// Chunks one file's text.
    pub fn chunk(&self, path: &RelPath, text: &str) -> Vec<Chunk> {
        let language = Language::detect(path);
        let kind = FileKind::detect(path, language);
        let lines = Lines::new(text, self.counter.as_ref());
        let mut cx = Cx { chunker: self, lines: &lines, language, raw: Vec::new(), depth: 0 };
        let mut names = Vec::new();
        match language.grammar().and_then(|g| parse(language, g, text)) {
            Some(tree) => {
                let root = tree.root_node();
                if lines.len() > 0 {
                    cx.node(root, 0, lines.len() - 1, &[]);
                }
                names = defined_names(language, root, text);
            }
            None if language == Language::Markdown => cx.markdown(),
            None => {
                if lines.len() > 0 {
                    cx.paragraphs(0, lines.len() - 1, &[]);
                }
            }
        }
        let raw = merge_small(cx.raw, self.config.min_tokens, |c| self.budget(&c.context), text);
        raw.into_iter()
            .map(|mut r| {
                // A header adds nothing to a chunk that contains it.
                if !r.context.is_empty() {
                    let normalized = text[r.bytes.clone()].split_whitespace().collect::<Vec<_>>().join(" ");
                    r.context.retain(|h| !contains_header(&normalized, h));
                }
                let (start_line, end_line) =
                    (lines.row_of(r.bytes.start), lines.row_of(r.bytes.end.saturating_sub(1).max(r.bytes.start)));
                let context_tokens: usize = r.context.iter().map(|c| self.counter.count(c)).sum();
                let body = &text[r.bytes.clone()];
                let tokens = self.counter.count(body) + context_tokens + self.counter.special_tokens();
                let hash = ContentHash(caret_crypto::chunk_content_hash(&r.context, body));
                let from = names.partition_point(|(at, _)| *at < r.bytes.start);
                let to = names.partition_point(|(at, _)| *at < r.bytes.end);
                let mut defines: Vec<String> = Vec::new();
                // Whole names only: a line too long for the budget is cut between words, and a
                // name may begin in one chunk and end in the next.
                for (at, name) in &names[from..to] {
                    if at + name.len() <= r.bytes.end && !defines.contains(name) {
                        defines.push(name.clone());
                    }
                }
                Chunk {
                    path: path.clone(),
                    language,
                    kind,
                    bytes: r.bytes,
                    start_line: to_u32(start_line + 1),
                    end_line: to_u32(end_line + 1),
                    context: r.context,
                    tokens: to_u32(tokens),
                    hash,
                    defines,
                }
            })
            .collect()
    }

    /// Tokens available to chunk text under the given context.
    fn budget(&self, context: &[String]) -> usize {
        let context_tokens: usize = context.iter().map(|c| self.counter.count(c)).sum();
        self.config.max_tokens.saturating_sub(self.counter.special_tokens() + context_tokens).max(1)
    }

    /// Limits context to a third of the budget: outer headers go first, then the innermost
    /// is shortened.
    fn fit_context(&self, mut context: Vec<String>) -> Vec<String> {
        let limit = self.config.max_tokens / 3;
        let total = |c: &[String]| c.iter().map(|h| self.counter.count(h)).sum::<usize>();
        while context.len() > 1 && total(&context) > limit {
            context.remove(0);
        }
        if let Some(inner) = context.last_mut() {
            while self.counter.count(inner) > limit {
                let keep = inner.chars().count() * 3 / 4;
                *inner = inner.chars().take(keep).collect::<String>() + "…";
                if keep == 0 {
                    inner.clear();
                }
            }
            if inner.is_empty() {
                context.pop();
            }
        }
        context
    }
}

/// Longest name kept as a definition's.
const MAX_NAME: usize = 100;

/// The names the definitions of a syntax tree give, with the byte each name starts at, in
/// order: a definition's `name` field (for a Rust `impl`, its type; for C-like declarators,
/// the identifier they declare).
fn defined_names(language: Language, root: tree_sitter::Node<'_>, text: &str) -> Vec<(usize, String)> {
    let kinds = language.definitions();
    let mut names = Vec::new();
    let mut cursor = root.walk();
    let mut stack = vec![root];
    while let Some(node) = stack.pop() {
        if let Some((name, t)) = definition_name(kinds, node, text) {
            names.push((name.start_byte(), t.to_owned()));
        }
        // Children pushed in reverse, so they come off the stack in order.
        let children: Vec<_> = node.named_children(&mut cursor).collect();
        stack.extend(children.into_iter().rev());
    }
    names.sort_by_key(|(at, _)| *at);
    names
}

/// The names a file's outermost definitions give — what other files import from it or call
/// it by — in order, without repeats: a definition nested in another (a method, an inner
/// function) is not one of them; one inside a wrapper that defines nothing (a decorator, an
/// `export`, an `if` at module level) is. Each with the line (1-based) of its first
/// definition. Empty for a file without a grammar.
pub fn top_level_names(path: &RelPath, text: &str) -> Vec<(String, u32)> {
    let language = Language::detect(path);
    let Some(tree) = language.grammar().and_then(|g| parse(language, g, text)) else { return Vec::new() };
    let kinds = language.definitions();
    let mut names: Vec<(String, u32)> = Vec::new();
    let mut cursor = tree.walk();
    let mut stack = vec![tree.root_node()];
    while let Some(node) = stack.pop() {
        if let Some((name, t)) = definition_name(kinds, node, text) {
            if !names.iter().any(|(n, _)| n == t) {
                names.push((t.to_owned(), to_u32(name.start_position().row + 1)));
            }
            continue;
        }
        let children: Vec<_> = node.named_children(&mut cursor).collect();
        stack.extend(children.into_iter().rev());
    }
    names
}

/// When `node` is a definition with a usable name (an identifier, not too long): the name's
/// node and text.
fn definition_name<'t>(
    kinds: &[&str],
    node: tree_sitter::Node<'t>,
    text: &'t str,
) -> Option<(tree_sitter::Node<'t>, &'t str)> {
    let kind = node.kind();
    if !(kinds.contains(&kind) || matches!(kind, "type_spec" | "type_alias")) {
        return None;
    }
    let name = name_of(node)?;
    let t = &text[name.byte_range()];
    let usable = !t.is_empty() && t.len() <= MAX_NAME && t.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '$');
    usable.then_some((name, t))
}

/// The node naming a definition.
fn name_of(node: tree_sitter::Node<'_>) -> Option<tree_sitter::Node<'_>> {
    if node.kind() == "impl_item" {
        return node.child_by_field_name("type").map(|t| t.child_by_field_name("type").unwrap_or(t));
    }
    if let Some(name) = node.child_by_field_name("name") {
        return Some(name);
    }
    // C and C++: `int *f(void)` names `f` inside nested declarators.
    let mut d = node.child_by_field_name("declarator")?;
    for _ in 0..8 {
        if d.kind().ends_with("identifier") {
            return Some(d);
        }
        d = d.child_by_field_name("declarator").or_else(|| d.child_by_field_name("name"))?;
    }
    None
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn parse(language: Language, grammar: tree_sitter::Language, text: &str) -> Option<tree_sitter::Tree> {
    PARSERS.with(|parsers| {
        let mut parsers = parsers.borrow_mut();
        let parser = match parsers.entry(language) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let mut p = tree_sitter::Parser::new();
                if let Err(err) = p.set_language(&grammar) {
                    tracing::error!(language = language.name(), error = %err, "tree-sitter grammar rejected");
                    return None;
                }
                v.insert(p)
            }
        };
        parser.parse(text, None)
    })
}

/// Line offsets and per-line token counts of a text.
struct Lines<'t> {
    text: &'t str,
    /// Byte offset where each line starts.
    starts: Vec<usize>,
    /// `prefix[i]` = tokens in lines `0..i`.
    prefix: Vec<usize>,
}

impl<'t> Lines<'t> {
    fn new(text: &'t str, counter: &dyn TokenCounter) -> Self {
        let mut starts = vec![0];
        starts.extend(memchr::memchr_iter(b'\n', text.as_bytes()).map(|i| i + 1));
        if starts.last() == Some(&text.len()) {
            starts.pop();
        }
        let mut prefix = Vec::with_capacity(starts.len() + 1);
        prefix.push(0);
        let mut total = 0;
        for row in 0..starts.len() {
            let start = starts[row];
            let end = starts.get(row + 1).copied().unwrap_or(text.len());
            total += counter.count(&text[start..end]);
            prefix.push(total);
        }
        Lines { text, starts, prefix }
    }

    fn len(&self) -> usize {
        self.starts.len()
    }

    /// Tokens in rows `first..=last`.
    fn tokens(&self, first: usize, last: usize) -> usize {
        self.prefix[last + 1] - self.prefix[first]
    }

    fn start(&self, row: usize) -> usize {
        self.starts[row]
    }

    /// End of a row's content, without its line terminator.
    fn end(&self, row: usize) -> usize {
        let end = self.starts.get(row + 1).copied().unwrap_or(self.text.len());
        let line = &self.text.as_bytes()[self.starts[row]..end];
        let trimmed = line.strip_suffix(b"\n").unwrap_or(line);
        let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
        self.starts[row] + trimmed.len()
    }

    fn line(&self, row: usize) -> &'t str {
        &self.text[self.start(row)..self.end(row)]
    }

    fn is_blank(&self, row: usize) -> bool {
        self.line(row).trim().is_empty()
    }

    fn row_of(&self, byte: usize) -> usize {
        self.starts.partition_point(|s| *s <= byte).saturating_sub(1)
    }
}

/// A chunk before its final accounting.
struct Raw {
    bytes: Range<usize>,
    context: Vec<String>,
    tokens: usize,
}

/// A run of whole lines and how to cut it further if it is too large.
struct Seg<'tree> {
    first: usize,
    last: usize,
    how: Descend<'tree>,
    starts_definition: bool,
    attaches_to_next: bool,
}

enum Descend<'tree> {
    /// Cut along this node's children.
    Node(tree_sitter::Node<'tree>),
    /// A markdown section: cut by paragraphs under this heading context.
    Section(Vec<String>),
    /// Cut by lines.
    Lines,
}

struct Cx<'a, 't> {
    chunker: &'a Chunker,
    lines: &'a Lines<'t>,
    language: Language,
    raw: Vec<Raw>,
    /// Nodes descended into on the way here (see [`MAX_DEPTH`]).
    depth: usize,
}

/// Syntax nodes the chunker descends through before it cuts by lines: code nests a few
/// dozen deep at most, while a generated file can nest thousands of constructs across lines
/// (bundled JavaScript), and a descent per level would overflow the stack.
const MAX_DEPTH: usize = 64;

impl<'a, 't> Cx<'a, 't> {
    /// Chunks rows `first..=last`, which hold `node`, along the node's children.
    fn node(&mut self, node: tree_sitter::Node<'_>, first: usize, last: usize, context: &[String]) {
        let mut segs = Vec::new();
        let mut start = first;
        let mut cursor = node.walk();
        for child in node.children(&mut cursor) {
            let end = child.end_position();
            // A node ending at column 0 ends on the previous line.
            let end_row = if end.column == 0 && end.row > child.start_position().row { end.row - 1 } else { end.row };
            let end_row = end_row.min(last);
            let kind = child.kind();
            let seg = Seg {
                first: start,
                last: end_row.max(start.saturating_sub(1)),
                how: Descend::Node(child),
                starts_definition: self.language.definitions().contains(&kind),
                attaches_to_next: lang::attaches_to_next(kind),
            };
            // A child that starts on the line where the previous segment ends shares that line
            // with it: one segment holds both, cut further along the larger node.
            if let Some(prev) = segs.last_mut().filter(|p: &&mut Seg<'_>| child.start_position().row <= p.last) {
                let prev_rows = match prev.how {
                    Descend::Node(n) => n.end_position().row - n.start_position().row,
                    _ => 0,
                };
                if end_row > prev.last {
                    prev.last = end_row;
                }
                if child.end_position().row - child.start_position().row >= prev_rows {
                    prev.how = seg.how;
                    prev.starts_definition = seg.starts_definition;
                }
                prev.attaches_to_next = false;
                start = prev.last + 1;
                continue;
            }
            if end_row < start {
                continue;
            }
            segs.push(seg);
            start = end_row + 1;
        }
        if start <= last {
            segs.push(Seg {
                first: start,
                last,
                how: Descend::Lines,
                starts_definition: false,
                attaches_to_next: false,
            });
        }
        if segs.len() == 1 && matches!(segs[0].how, Descend::Node(n) if n.child_count() == 0) {
            segs[0].how = Descend::Lines;
        }
        self.group(segs, context);
    }

    /// Groups consecutive segments into chunks within the budget; descends into those too big.
    fn group(&mut self, segs: Vec<Seg<'_>>, context: &[String]) {
        let budget = self.chunker.budget(context);
        let min = self.chunker.config.min_tokens;
        let mut cur: Option<(usize, usize)> = None;
        let mut attached_from: Option<usize> = None;
        for seg in segs {
            let tokens = self.lines.tokens(seg.first, seg.last);
            if tokens > budget {
                // What is held goes first; a small remainder or the comments just above ride
                // along into the oversized segment's first piece.
                let lead = match cur.take() {
                    Some((a, b)) if self.lines.tokens(a, b) < min => a,
                    Some((a, b)) => match attached_from {
                        Some(from) if from > a => {
                            self.emit_rows(a, from - 1, context);
                            from
                        }
                        _ => {
                            self.emit_rows(a, b, context);
                            seg.first
                        }
                    },
                    None => seg.first,
                };
                attached_from = None;
                self.descend(Seg { first: lead, ..seg }, context);
                continue;
            }
            cur = Some(match cur {
                None => (seg.first, seg.last),
                Some((a, b)) => {
                    let held = self.lines.tokens(a, b);
                    if held + tokens > budget || (seg.starts_definition && held >= min) {
                        // Comments and attributes just above go with what follows them.
                        let carry = attached_from
                            .filter(|from| *from > a && self.lines.tokens(*from, seg.last) <= budget)
                            .unwrap_or(seg.first);
                        self.emit_rows(a, carry - 1, context);
                        (carry, seg.last)
                    } else {
                        (a, seg.last)
                    }
                }
            });
            attached_from = if seg.attaches_to_next { attached_from.or(Some(seg.first)) } else { None };
        }
        if let Some((a, b)) = cur {
            self.emit_rows(a, b, context);
        }
    }

    fn descend(&mut self, seg: Seg<'_>, context: &[String]) {
        match seg.how {
            Descend::Node(node) if node.child_count() > 0 && self.depth < MAX_DEPTH => {
                let header = seg.starts_definition.then(|| self.header(node)).flatten();
                let header = header.filter(|h| !context.last().is_some_and(|outer| outer.contains(h.as_str())));
                let context = match header {
                    Some(h) => {
                        let mut c = context.to_vec();
                        c.push(h);
                        self.chunker.fit_context(c)
                    }
                    None => context.to_vec(),
                };
                self.depth += 1;
                self.node(node, seg.first, seg.last, &context);
                self.depth -= 1;
            }
            Descend::Section(heading) => self.paragraphs(seg.first, seg.last, &heading),
            Descend::Node(_) | Descend::Lines => self.by_lines(seg.first, seg.last, context),
        }
    }

    /// The header of a definition: its text up to its body, on one line.
    fn header(&self, node: tree_sitter::Node<'_>) -> Option<String> {
        let text = self.lines.text;
        let inner = node.child_by_field_name("definition").unwrap_or(node);
        let body = inner
            .child_by_field_name("body")
            .or_else(|| inner.child_by_field_name("declaration_list"))
            .map(|b| b.start_byte());
        let start = node.start_byte();
        let end = match body {
            Some(b) if b > start => {
                // Keep an opening brace that starts the body.
                let brace = text[b..].starts_with('{');
                if brace { b + 1 } else { b }
            }
            _ => text[start..].find('\n').map_or(node.end_byte(), |i| start + i),
        };
        let raw = text.get(start..end.min(node.end_byte()))?;
        let mut header = raw.split_whitespace().collect::<Vec<_>>().join(" ");
        if header.len() > 160 {
            let cut = (0..=160).rev().find(|i| header.is_char_boundary(*i)).unwrap_or(0);
            header.truncate(cut);
            header.push('…');
        }
        (!header.is_empty()).then_some(header)
    }

    /// Markdown: one segment per heading section, each carrying its heading path.
    fn markdown(&mut self) {
        let n = self.lines.len();
        if n == 0 {
            return;
        }
        let mut segs = Vec::new();
        let mut path: Vec<(usize, String)> = Vec::new();
        let mut section_start = 0;
        let mut section_context: Vec<String> = Vec::new();
        let mut fence: Option<&str> = None;
        for row in 0..n {
            let line = self.lines.line(row);
            let trimmed = line.trim_start();
            if let Some(f) = fence {
                if trimmed.starts_with(f) {
                    fence = None;
                }
                continue;
            }
            if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
                fence = Some(&trimmed[..3]);
                continue;
            }
            let level = trimmed.bytes().take_while(|b| *b == b'#').count();
            let is_heading = (1..=6).contains(&level)
                && line.len() - trimmed.len() < 4
                && trimmed[level..].chars().next().is_none_or(char::is_whitespace);
            if !is_heading {
                continue;
            }
            if row > section_start {
                segs.push(self.section(section_start, row - 1, section_context.clone()));
            }
            path.retain(|(l, _)| *l < level);
            path.push((level, trimmed.trim().to_owned()));
            // The heading path, own heading included: pieces of a long section keep it.
            section_context = path.iter().map(|(_, h)| h.clone()).collect();
            section_start = row;
        }
        segs.push(self.section(section_start, n - 1, section_context));
        self.group_sections(segs);
    }

    fn section(&self, first: usize, last: usize, context: Vec<String>) -> Seg<'static> {
        let context = self.chunker.fit_context(context);
        Seg { first, last, how: Descend::Section(context), starts_definition: true, attaches_to_next: false }
    }

    /// Sections have their own context each; a section that fits is one chunk.
    fn group_sections(&mut self, segs: Vec<Seg<'static>>) {
        for seg in segs {
            let Descend::Section(context) = &seg.how else { continue };
            let context = context.clone();
            if self.lines.tokens(seg.first, seg.last) <= self.chunker.budget(&context) {
                self.emit_rows(seg.first, seg.last, &context);
            } else {
                self.descend(seg, &context);
            }
        }
    }

    /// Cuts rows into blank-line separated paragraphs, then groups them.
    fn paragraphs(&mut self, first: usize, last: usize, context: &[String]) {
        let mut segs = Vec::new();
        let mut start = first;
        // A Markdown code block is one paragraph, blank lines and all (cut further only when
        // it alone is over budget).
        let mut fence: Option<String> = None;
        for row in first..=last {
            if self.language == Language::Markdown {
                let t = self.lines.line(row).trim_start();
                match &fence {
                    Some(f) if t.starts_with(f.as_str()) => fence = None,
                    Some(_) => continue,
                    None if t.starts_with("```") || t.starts_with("~~~") => fence = Some(t[..3].to_owned()),
                    None => {}
                }
            }
            if fence.is_none() && row > start && self.lines.is_blank(row) && !self.lines.is_blank(row - 1) {
                segs.push(Seg {
                    first: start,
                    last: row - 1,
                    how: Descend::Lines,
                    starts_definition: false,
                    attaches_to_next: false,
                });
                start = row;
            }
        }
        segs.push(Seg { first: start, last, how: Descend::Lines, starts_definition: false, attaches_to_next: false });
        if segs.len() == 1 {
            return self.by_lines(first, last, context);
        }
        self.group(segs, context);
    }

    /// Groups single lines; a line too long alone is cut between words.
    fn by_lines(&mut self, first: usize, last: usize, context: &[String]) {
        let budget = self.chunker.budget(context);
        let mut cur: Option<(usize, usize)> = None;
        for row in first..=last {
            let tokens = self.lines.tokens(row, row);
            if tokens > budget {
                if let Some((a, b)) = cur.take() {
                    self.emit_rows(a, b, context);
                }
                self.long_line(row, context, budget);
                continue;
            }
            cur = match cur {
                Some((a, _)) if self.lines.tokens(a, row) <= budget => Some((a, row)),
                Some((a, b)) => {
                    self.emit_rows(a, b, context);
                    Some((row, row))
                }
                None => Some((row, row)),
            };
        }
        if let Some((a, b)) = cur {
            self.emit_rows(a, b, context);
        }
    }

    /// Cuts one over-long line into pieces of at most `budget` tokens, at word boundaries
    /// where possible.
    fn long_line(&mut self, row: usize, context: &[String], budget: usize) {
        let counter = self.chunker.counter.as_ref();
        let text = self.lines.text;
        let (line_start, line_end) = (self.lines.start(row), self.lines.end(row));
        let mut piece_start = line_start;
        let mut piece_tokens = 0;
        let mut pos = line_start;
        while pos < line_end {
            // The next word: whitespace runs and single non-word characters stand alone.
            let rest = &text[pos..line_end];
            let first = rest.chars().next().map_or(1, char::len_utf8);
            let len = if rest.starts_with(|c: char| c.is_alphanumeric()) {
                rest.find(|c: char| !c.is_alphanumeric()).unwrap_or(rest.len())
            } else {
                first
            };
            let mut word = &text[pos..pos + len];
            let mut tokens = counter.count(word);
            if tokens > budget {
                // A single word over budget: the longest prefix within budget, found by
                // bisection over a window no tokenizer can fit more than `budget` tokens in.
                let window = word.len().min(budget.saturating_mul(16).max(512));
                let (mut lo, mut hi) = (first, window);
                while lo < hi {
                    let mid = (lo + hi).div_ceil(2);
                    let mid = (mid..=hi).find(|m| word.is_char_boundary(*m)).unwrap_or(hi);
                    if mid > lo && counter.count(&word[..mid]) <= budget {
                        lo = mid;
                    } else {
                        hi = (lo..mid).rev().find(|m| word.is_char_boundary(*m)).unwrap_or(lo);
                    }
                }
                word = &word[..lo];
                tokens = counter.count(word);
            }
            if piece_tokens + tokens > budget && pos > piece_start {
                self.emit_bytes(piece_start..pos, context);
                piece_start = pos;
                piece_tokens = 0;
            }
            piece_tokens += tokens;
            pos += word.len();
        }
        if pos > piece_start {
            self.emit_bytes(piece_start..pos, context);
        }
    }

    /// Emits rows `first..=last`, without blank lines at either end.
    fn emit_rows(&mut self, first: usize, last: usize, context: &[String]) {
        if last < first {
            return;
        }
        let Some(a) = (first..=last).find(|r| !self.lines.is_blank(*r)) else { return };
        let Some(b) = (a..=last).rev().find(|r| !self.lines.is_blank(*r)) else { return };
        let tokens = self.lines.tokens(a, b);
        self.raw.push(Raw { bytes: self.lines.start(a)..self.lines.end(b), context: context.to_vec(), tokens });
    }

    fn emit_bytes(&mut self, bytes: Range<usize>, context: &[String]) {
        let text = &self.lines.text[bytes.clone()];
        if text.trim().is_empty() {
            return;
        }
        let tokens = self.chunker.counter.count(text);
        self.raw.push(Raw { bytes, context: context.to_vec(), tokens });
    }
}

/// Merges chunks under `min` tokens into a neighbour where the result stays within budget:
/// into the previous chunk of the same context; else into the next chunk when that one is
/// nested in it (a header line joins its body); else, for closing punctuation such as `}`,
/// into the previous chunk whatever its context.
fn merge_small(raw: Vec<Raw>, min: usize, budget: impl Fn(&Raw) -> usize, text: &str) -> Vec<Raw> {
    let mut out: Vec<Raw> = Vec::with_capacity(raw.len());
    let mut pending_small: Option<Raw> = None;
    for r in raw {
        if let Some(small) = pending_small.take() {
            if r.context.starts_with(&small.context) && small.tokens + r.tokens <= budget(&r) {
                out.push(Raw {
                    bytes: small.bytes.start..r.bytes.end,
                    context: r.context,
                    tokens: small.tokens + r.tokens,
                });
                continue;
            }
            out.push(small);
        }
        if r.tokens < min {
            let only_punctuation = !text[r.bytes.clone()].chars().any(char::is_alphanumeric);
            if let Some(prev) = out.last_mut()
                && (prev.context == r.context || only_punctuation)
                && prev.tokens + r.tokens <= budget(prev)
            {
                prev.bytes.end = r.bytes.end;
                prev.tokens += r.tokens;
                continue;
            }
            pending_small = Some(r);
            continue;
        }
        out.push(r);
    }
    out.extend(pending_small);
    out
}

/// Whether `text` contains `header`, ignoring whitespace and a trailing `{`.
fn contains_header(normalized_text: &str, header: &str) -> bool {
    let header = header.trim_end_matches(['{', ' ', '…']);
    !header.is_empty() && normalized_text.contains(&header.split_whitespace().collect::<Vec<_>>().join(" "))
}

#[cfg(test)]
mod tests;
