//! A documentation page's HTML → its title, canonical URL, links, and its main content as
//! Markdown with its headings (and their anchors).
//!
//! The HTML is parsed by html5ever (the DOM `htmd` builds). The main content is the first of
//! `<main>`, `[role=main]`, `<article>`, and the content containers docs generators use
//! (Sphinx's `.body`, MkDocs' `.md-content`, rustdoc's `#main-content`, …), else `<body>`;
//! inside it, navigation, headers and footers, sidebars, tables of contents, forms and
//! scripts are dropped (by element, ARIA role, or a class or id naming one). Links become
//! their text: URLs are noise to search. Pure functions of the text: no IO.

use std::rc::Rc;

use markup5ever_rcdom::{Node, NodeData};

/// What a page holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// Its `<title>` (else its first heading, else empty).
    pub title: String,
    /// Its `<link rel=canonical>`, resolved.
    pub canonical: Option<url::Url>,
    /// Every `<a href>` of the page (navigation included), resolved, fragments dropped.
    pub links: Vec<url::Url>,
    /// The main content as Markdown.
    pub markdown: String,
    /// The headings of the main content, in order.
    pub headings: Vec<Heading>,
}

/// A heading of a page.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Heading {
    /// Its line in the page's Markdown, 1-based (0: not found there).
    pub line: u32,
    /// 1 to 6.
    pub level: u8,
    /// Its text.
    pub text: String,
    /// Its anchor in the page (`#anchor`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<String>,
}

/// Containers of a page's main content, tried in order (a CSS-like `tag`, `#id` or `.class`).
const MAIN: &[&str] = &[
    "main",
    "[role=main]",
    "article",
    "#main-content",
    ".md-content",
    ".rst-content",
    ".body",
    ".document",
    "#content",
    ".content",
    ".markdown-body",
];

/// Elements never part of the content.
const DROPPED_TAGS: &[&str] = &[
    "script", "style", "nav", "header", "footer", "aside", "form", "noscript", "svg", "iframe", "button", "template",
    "select", "input", "textarea", "head", "link", "meta",
];

/// Words that mark navigation in a class or id (as a whole word or a `-`/`_` separated part).
const DROPPED_WORDS: &[&str] = &[
    "nav",
    "navbar",
    "navigation",
    "menu",
    "sidebar",
    "sidebarwrapper",
    "toc",
    "breadcrumb",
    "breadcrumbs",
    "footer",
    "nosearch",
    "related",
    "headerlink",
    "skip",
    "searchbox",
    "pagination",
    "prev",
    "next",
    "edit",
    "feedback",
];

/// ARIA roles of navigation.
const DROPPED_ROLES: &[&str] = &["navigation", "banner", "contentinfo", "search", "complementary"];

/// Elements nested deeper than this lose what is below them: no documentation nests so
/// deep, and the conversion recurses along the tree.
const MAX_DEPTH: usize = 256;

/// Stack of the thread a page is read on (the conversion recurses along the tree).
const STACK: usize = 64 << 20;

/// Open tags a page may leave open at once (an estimate made before parsing): the HTML
/// parser's tree builder slows quadratically with the depth of the open elements, so a page
/// past this is refused rather than read for minutes.
pub const MAX_OPEN: usize = 5_000;

/// An estimate of how deeply a page nests its elements: the most tags open at once, counting
/// `<name` as an opening and `</name` as a closing, leaving out void elements, `/>` and the
/// elements whose end tag may be left out (`li`, `p`, `td`, …: the parser closes those
/// itself). Not a parse: a guard before one.
pub fn nesting(text: &str) -> usize {
    const FLAT: [&str; 33] = [
        "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr",
        "li", "p", "td", "th", "tr", "dt", "dd", "option", "optgroup", "tbody", "thead", "tfoot", "colgroup",
        "caption", "rp", "rt", "html", "head", "body",
    ];
    let bytes = text.as_bytes();
    let name_at = |i: usize| -> String {
        bytes[i.min(bytes.len())..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric())
            .map(|b| b.to_ascii_lowercase() as char)
            .collect()
    };
    let (mut depth, mut most) = (0usize, 0usize);
    let mut i = 0;
    while let Some(at) = bytes[i..].iter().position(|b| *b == b'<') {
        i += at + 1;
        match bytes.get(i) {
            Some(b'/') if !FLAT.contains(&name_at(i + 1).as_str()) => depth = depth.saturating_sub(1),
            Some(c) if c.is_ascii_alphabetic() => {
                let name = name_at(i);
                let end = bytes[i..].iter().position(|b| *b == b'>').map_or(bytes.len(), |e| i + e);
                let self_closing = end > 0 && bytes.get(end - 1) == Some(&b'/');
                if !FLAT.contains(&name.as_str()) && !self_closing {
                    depth += 1;
                    most = most.max(depth);
                }
            }
            _ => {}
        }
    }
    most
}

/// Reads a page fetched from `base` (on a thread with a large stack: what nests deeper than
/// [`MAX_DEPTH`] is cut, not a crash).
pub fn html(text: &str, base: &url::Url) -> Extracted {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("caret-docs-page".into())
            .stack_size(STACK)
            .spawn_scoped(scope, || read_html(text, base))
            .ok()
            .and_then(|t| t.join().ok())
    })
    .unwrap_or_else(|| Extracted {
        title: String::new(),
        canonical: None,
        links: Vec::new(),
        markdown: String::new(),
        headings: Vec::new(),
    })
}

/// Drops what lies deeper than [`MAX_DEPTH`] below `root` (without recursing).
fn cap_depth(root: &Rc<Node>) {
    let mut stack = vec![(root.clone(), 0usize)];
    while let Some((node, depth)) = stack.pop() {
        if depth >= MAX_DEPTH {
            node.children.borrow_mut().clear();
            continue;
        }
        stack.extend(node.children.borrow().iter().map(|c| (c.clone(), depth + 1)));
    }
}

fn read_html(text: &str, base: &url::Url) -> Extracted {
    let converter = htmd::HtmlToMarkdown::builder()
        .skip_tags(vec!["img", "picture", "video", "audio", "canvas"])
        .add_handler(vec!["a"], |h: &dyn htmd::element_handler::Handlers, e: htmd::Element<'_>| {
            Some(h.walk_children(e.node))
        })
        .build();
    let Ok(document) = converter.html_to_tree(text) else {
        return Extracted {
            title: String::new(),
            canonical: None,
            links: Vec::new(),
            markdown: String::new(),
            headings: Vec::new(),
        };
    };
    cap_depth(&document);
    let mut title = String::new();
    let mut canonical = None;
    let mut links = Vec::new();
    let mut base = base.clone();
    walk(&document, &mut |n| {
        let Some(tag) = tag(n) else { return true };
        match tag {
            "title" if title.is_empty() => title = squash(&text_of(n)),
            "base" => {
                if let Some(b) = attr(n, "href").and_then(|h| base.join(&h).ok()) {
                    base = b;
                }
            }
            "link"
                if attr(n, "rel")
                    .is_some_and(|r| r.split_whitespace().any(|w| w.eq_ignore_ascii_case("canonical"))) =>
            {
                canonical = attr(n, "href").and_then(|h| base.join(&h).ok());
            }
            "a" => {
                if let Some(mut u) = attr(n, "href").and_then(|h| base.join(h.trim()).ok()) {
                    u.set_fragment(None);
                    if matches!(u.scheme(), "http" | "https" | "file") && !links.contains(&u) {
                        links.push(u);
                    }
                }
            }
            _ => {}
        }
        true
    });
    // (The document stays alive meanwhile: dropping an rcdom node empties all below it.)
    let main = MAIN
        .iter()
        .find_map(|sel| find(&document, sel))
        .or_else(|| find(&document, "body"))
        .unwrap_or_else(|| document.clone());
    prune(&main);
    let mut headings = Vec::new();
    walk(&main, &mut |n| {
        if let Some(level) = tag(n).and_then(heading_level) {
            let text = squash(&text_of(n));
            if !text.is_empty() {
                headings.push(Heading { line: 0, level, text, anchor: anchor_of(n) });
            }
            return false;
        }
        true
    });
    let body = converter.tree_to_markdown(&main);
    if title.is_empty() {
        title = headings.first().map(|h| h.text.clone()).unwrap_or_default();
    }
    let (markdown, headings) = page(&title, &body, headings);
    Extracted { title, canonical, links, markdown, headings }
}

/// Reads a Markdown page (an `llms.txt`, a `.md` file): its links (`[text](url)`, resolved
/// against `base`) and headings; its title the first heading's, else `fallback`.
pub fn markdown(text: &str, base: &url::Url, fallback: &str) -> Extracted {
    let mut links = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest.find([')', ' ', '\n']).unwrap_or(rest.len());
        if let Ok(mut u) = base.join(rest[..end].trim_matches(['<', '>'])) {
            u.set_fragment(None);
            if matches!(u.scheme(), "http" | "https" | "file") && !links.contains(&u) {
                links.push(u);
            }
        }
    }
    let headings: Vec<Heading> = markdown_headings(text)
        .into_iter()
        .map(|(_, line)| {
            let level = line.bytes().take_while(|b| *b == b'#').count();
            Heading {
                line: 0,
                level: u8::try_from(level).unwrap_or(6),
                text: squash(&unescape(&line[level..])),
                anchor: None,
            }
        })
        .collect();
    let title = headings.first().map_or_else(|| fallback.to_owned(), |h| h.text.clone());
    let (markdown, headings) = page(&title, text, headings);
    Extracted { title, canonical: None, links, markdown, headings }
}

/// reStructuredText's section titles (a line underlined, or over- and underlined, with `=`,
/// `-`, `~`, …) as Markdown headings, levels in order of first use; the rest kept as text.
pub fn rst_to_markdown(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let adornment = |l: &str| -> Option<char> {
        let t = l.trim_end();
        let c = t.chars().next()?;
        (t.len() >= 3 && "=-~^\"'`#*+:._".contains(c) && t.chars().all(|x| x == c)).then_some(c)
    };
    let mut styles: Vec<(char, bool)> = Vec::new();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let over = adornment(lines[i]);
        // Over- and underlined: adornment, title, the same adornment.
        if let (Some(c), Some(title), Some(under)) =
            (over, lines.get(i + 1), lines.get(i + 2).and_then(|l| adornment(l)))
            && under == c
            && !title.trim().is_empty()
        {
            out.push(heading(&mut styles, (c, true), title.trim()));
            i += 3;
            continue;
        }
        if let Some(c) = lines.get(i + 1).and_then(|l| adornment(l))
            && !lines[i].trim().is_empty()
            && adornment(lines[i]).is_none()
            && lines[i + 1].trim_end().len() >= lines[i].trim().len().min(3)
        {
            out.push(heading(&mut styles, (c, false), lines[i].trim()));
            i += 2;
            continue;
        }
        out.push(lines[i].to_owned());
        i += 1;
    }
    fn heading(styles: &mut Vec<(char, bool)>, style: (char, bool), title: &str) -> String {
        let level = match styles.iter().position(|s| *s == style) {
            Some(p) => p + 1,
            None => {
                styles.push(style);
                styles.len()
            }
        };
        format!("{} {title}", "#".repeat(level.min(6)))
    }
    out.join("\n")
}

/// A page's Markdown: a `# title` first unless its first heading says the same, then the
/// body; each heading placed on its line (`headings` in document order, matched by text).
pub fn page(title: &str, body: &str, mut headings: Vec<Heading>) -> (String, Vec<Heading>) {
    let body = tidy(body);
    let first = body.lines().find(|l| !l.trim().is_empty()).map(|l| l.trim_start_matches('#').trim().to_owned());
    let titled = !title.is_empty() && first.as_deref().is_none_or(|f| squash(&unescape(f)) != squash(title));
    let markdown = if titled { format!("# {title}\n\n{body}") } else { body };
    let mut next = 0;
    for (i, line) in markdown_headings(&markdown) {
        let text = squash(&unescape(line.trim_start_matches('#')));
        if let Some(k) = headings[next..].iter().position(|h| squash(&h.text) == text) {
            headings[next + k].line = u32::try_from(i + 1).unwrap_or(u32::MAX);
            next += k + 1;
        }
    }
    if titled {
        headings.insert(0, Heading { line: 1, level: 1, text: title.to_owned(), anchor: None });
    }
    (markdown, headings)
}

/// The ATX headings of Markdown outside code fences: (line index, line).
pub fn markdown_headings(markdown: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in markdown.lines().enumerate() {
        let t = line.trim_start();
        if let Some(f) = fence {
            if t.starts_with(f) {
                fence = None;
            }
            continue;
        }
        if t.starts_with("```") || t.starts_with("~~~") {
            fence = Some(&t[..3]);
            continue;
        }
        let level = t.bytes().take_while(|b| *b == b'#').count();
        if (1..=6).contains(&level) && line.len() - t.len() < 4 && t[level..].starts_with(' ') {
            out.push((i, t));
        }
    }
    out
}

/// Collapses blank-line runs and trailing spaces, and drops orphaned labels (see
/// [`orphan_labels`]).
fn tidy(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut blank = 0;
    let lines: Vec<&str> = markdown.trim().lines().collect();
    let orphans = orphan_labels(&lines);
    for (i, line) in lines.into_iter().enumerate() {
        if orphans.contains(&i) {
            continue;
        }
        let line = line.trim_end();
        if line.is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Lines of runs of two or more paragraphs that are each only a bold label ending in a colon
/// (`**attach-stmt:**`), outside code fences: what is left of figures whose labels stayed
/// when the figures (SVG syntax diagrams, images) were dropped. They hold no text to search
/// and would drown the paragraph after them in the chunk's embedding. One label followed by
/// its text (`**Note:** …`, or `**Note:**` then a paragraph) stays.
fn orphan_labels(lines: &[&str]) -> std::collections::HashSet<usize> {
    let is_label = |l: &str| {
        let t = l.trim();
        t.len() < 100 && t.starts_with("**") && t.ends_with(":**") && !t[2..t.len() - 3].contains("**")
    };
    let mut out = std::collections::HashSet::new();
    let (mut run, mut fence) = (Vec::new(), false);
    let mut end_run = |run: &mut Vec<usize>| {
        if run.len() >= 2 {
            out.extend(run.iter().copied());
        }
        run.clear();
    };
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fence = !fence;
        }
        if !fence && is_label(l) {
            run.push(i);
        } else if fence || !t.is_empty() {
            end_run(&mut run);
        }
    }
    end_run(&mut run);
    out
}

/// Markdown's backslash escapes undone.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && chars.peek().is_some_and(|n| n.is_ascii_punctuation()) {
            continue;
        }
        out.push(c);
    }
    out
}

/// Whitespace runs as one space, trimmed.
fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn heading_level(tag: &str) -> Option<u8> {
    match tag {
        "h1" => Some(1),
        "h2" => Some(2),
        "h3" => Some(3),
        "h4" => Some(4),
        "h5" => Some(5),
        "h6" => Some(6),
        _ => None,
    }
}

/// A heading's anchor: its id, an id or name inside it, or a named anchor just before it.
fn anchor_of(n: &Rc<Node>) -> Option<String> {
    if let Some(id) = attr(n, "id") {
        return Some(id);
    }
    let mut inner = None;
    walk(n, &mut |c| {
        if inner.is_none() && tag(c).is_some() {
            inner = attr(c, "id").or_else(|| attr(c, "name"));
        }
        inner.is_none()
    });
    inner.or_else(|| {
        let parent = n.parent.take()?.upgrade();
        let found = parent.as_ref().and_then(|p| {
            let children = p.children.borrow();
            let at = children.iter().position(|c| Rc::ptr_eq(c, n))?;
            children[..at]
                .iter()
                .rev()
                .find(|c| tag(c).is_some())
                .filter(|c| tag(c) == Some("a"))
                .and_then(|a| attr(a, "name").or_else(|| attr(a, "id")))
        });
        n.parent.set(parent.as_ref().map(Rc::downgrade));
        found
    })
}

/// Drops what is not content from below `root`.
fn prune(root: &Rc<Node>) {
    let mut children = root.children.borrow_mut();
    children.retain(|c| !dropped(c));
    for c in children.iter() {
        prune(c);
    }
}

fn dropped(n: &Rc<Node>) -> bool {
    match &n.data {
        NodeData::Comment { .. } | NodeData::ProcessingInstruction { .. } => true,
        NodeData::Element { .. } => {
            let Some(t) = tag(n) else { return false };
            if DROPPED_TAGS.contains(&t) {
                return true;
            }
            if attr(n, "role").is_some_and(|r| DROPPED_ROLES.contains(&r.as_str())) || attr(n, "hidden").is_some() {
                return true;
            }
            let names = [attr(n, "class").unwrap_or_default(), attr(n, "id").unwrap_or_default()];
            names.iter().flat_map(|s| s.split_whitespace()).any(|word| {
                let w = word.to_ascii_lowercase();
                DROPPED_WORDS.contains(&w.as_str()) || w.split(['-', '_']).any(|part| DROPPED_WORDS.contains(&part))
            })
        }
        _ => false,
    }
}

/// The first element below `root` matching `sel` (`tag`, `#id`, `.class` or `[attr=value]`).
fn find(root: &Rc<Node>, sel: &str) -> Option<Rc<Node>> {
    let matches = |n: &Rc<Node>| -> bool {
        if let Some(id) = sel.strip_prefix('#') {
            attr(n, "id").as_deref() == Some(id)
        } else if let Some(class) = sel.strip_prefix('.') {
            attr(n, "class").is_some_and(|c| c.split_whitespace().any(|w| w == class))
        } else if let Some(pair) = sel.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            attr(n, k).as_deref() == Some(v)
        } else {
            tag(n) == Some(sel)
        }
    };
    let mut found = None;
    walk(root, &mut |n| {
        if found.is_none() && tag(n).is_some() && matches(n) {
            found = Some(n.clone());
        }
        found.is_none()
    });
    found
}

/// Visits `root` and its descendants in document order; `visit` answers whether to go below.
fn walk(root: &Rc<Node>, visit: &mut dyn FnMut(&Rc<Node>) -> bool) {
    if !visit(root) {
        return;
    }
    let children: Vec<Rc<Node>> = root.children.borrow().clone();
    for c in &children {
        walk(c, visit);
    }
}

fn tag(n: &Node) -> Option<&str> {
    match &n.data {
        NodeData::Element { name, .. } => Some(&name.local),
        _ => None,
    }
}

fn attr(n: &Node, key: &str) -> Option<String> {
    match &n.data {
        NodeData::Element { attrs, .. } => {
            attrs.borrow().iter().find(|a| &*a.name.local == key).map(|a| a.value.to_string())
        }
        _ => None,
    }
}

fn text_of(n: &Rc<Node>) -> String {
    let mut out = String::new();
    walk(n, &mut |c| {
        if let NodeData::Text { contents } = &c.data {
            out.push_str(&contents.borrow());
        }
        true
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(html_text: &str) -> Extracted {
        html(html_text, &url::Url::parse("https://docs.example.com/lib/guide/intro.html").unwrap())
    }

    #[test]
    fn labels_left_by_dropped_figures_go_and_a_single_label_stays() {
        let md = "# ATTACH\n\n**attach-stmt:**\n\n**expr:**\n\n**signed-number:**\n\nThe ATTACH statement adds a file.\n\n\
                  **Note:**\n\nKeep this one.\n\n```\n**a:**\n\n**b:**\n```\n";
        let (page, _) = page("ATTACH", md, Vec::new());
        assert_eq!(
            page,
            "# ATTACH\n\nThe ATTACH statement adds a file.\n\n**Note:**\n\nKeep this one.\n\n```\n**a:**\n\n**b:**\n```\n"
        );
    }

    #[test]
    fn the_main_content_becomes_markdown_without_the_navigation() {
        let page = check(
            r##"<!doctype html><html><head><title>Intro · Lib</title>
            <link rel="canonical" href="/lib/guide/intro.html"></head><body>
            <nav><a href="../api/index.html">API</a> <a href="https://elsewhere.org/x">Out</a></nav>
            <div class="sphinxsidebar">Search the docs</div>
            <div class="body" role="main">
              <h1 id="intro">Intro<a class="headerlink" href="#intro">¶</a></h1>
              <p>Lib parses <a href="config.html#files">config files</a> fast.</p>
              <div class="toc">Contents</div>
              <a name="usage"></a><h2>Usage</h2>
              <pre><code class="language-python">import lib

lib.load("a.toml")</code></pre>
              <h3><span id="errors">Errors</span></h3><p>They raise <code>LibError</code>.</p>
            </div>
            <footer>© Lib authors</footer>
            <script>var tracking = 1;</script></body></html>"##,
        );
        assert_eq!(page.title, "Intro · Lib");
        assert_eq!(
            page.canonical.as_ref().map(url::Url::as_str),
            Some("https://docs.example.com/lib/guide/intro.html")
        );
        let links: Vec<&str> = page.links.iter().map(url::Url::as_str).collect();
        assert_eq!(
            links,
            [
                "https://docs.example.com/lib/api/index.html",
                "https://elsewhere.org/x",
                "https://docs.example.com/lib/guide/intro.html",
                "https://docs.example.com/lib/guide/config.html"
            ]
        );
        let md = &page.markdown;
        for gone in ["API", "Search the docs", "Contents", "©", "tracking", "¶", "config.html"] {
            assert!(!md.contains(gone), "{gone:?} left in:\n{md}");
        }
        assert!(md.starts_with("# Intro · Lib\n\n# Intro\n\nLib parses config files fast."), "{md}");
        assert!(md.contains("```python\nimport lib\n\nlib.load(\"a.toml\")\n```"), "the code block whole:\n{md}");
        let heads: Vec<(u32, u8, &str, Option<&str>)> =
            page.headings.iter().map(|h| (h.line, h.level, h.text.as_str(), h.anchor.as_deref())).collect();
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(
            heads,
            [
                (1, 1, "Intro · Lib", None),
                (3, 1, "Intro", Some("intro")),
                (7, 2, "Usage", Some("usage")),
                (heads[3].0, 3, "Errors", Some("errors"))
            ]
        );
        assert_eq!(lines[heads[3].0 as usize - 1], "### Errors");
    }

    #[test]
    fn markdown_and_restructuredtext_pages_keep_their_headings_and_links() {
        let base = url::Url::parse("https://d.example/llms.txt").unwrap();
        let llms = markdown(
            "# Lib\n\n> A library.\n\n## Docs\n\n- [Guide](https://d.example/guide.md): start here\n- [API](/api.html#top)\n",
            &base,
            "llms.txt",
        );
        assert_eq!(llms.title, "Lib");
        let links: Vec<&str> = llms.links.iter().map(url::Url::as_str).collect();
        assert_eq!(links, ["https://d.example/guide.md", "https://d.example/api.html"]);
        assert_eq!(
            llms.headings.iter().map(|h| (h.line, h.text.as_str())).collect::<Vec<_>>(),
            [(1, "Lib"), (5, "Docs")]
        );
        let md = rst_to_markdown("=====\nTitle\n=====\n\nIntro.\n\nSection\n-------\n\nText.\n\nOther\n=====\n");
        assert_eq!(md, "# Title\n\nIntro.\n\n## Section\n\nText.\n\n### Other", "an underline alone is another style");
    }

    #[test]
    fn broken_markup_and_pages_without_a_main_part_still_read() {
        let page = check("<title>T</title><div class=menu>Home</div><p>Just <b>text</b><p>and more <i>unclosed");
        assert_eq!(page.markdown, "# T\n\nJust **text**\n\nand more *unclosed*\n");
        let none = check("");
        assert_eq!((none.title.as_str(), none.markdown.as_str()), ("", ""));
        // Nested 2,000 deep: cut below MAX_DEPTH, read, no crash.
        let deep = check(&format!("<title>Deep</title><p>top</p>{}x{}", "<div>".repeat(2_000), "</div>".repeat(2_000)));
        assert_eq!(deep.markdown, "# Deep\n\ntop\n");
        // How deep a page nests, estimated before parsing (the guard against a page that would
        // take the parser minutes).
        assert_eq!(
            nesting("<html><body><p>a<br>b<img src=x/></p><ul><li>x<li>y</ul><div><div/></div></body></html>"),
            1
        );
        assert_eq!(nesting("<div><section><div><span>x</span></div></section></div>"), 4);
        assert_eq!(nesting(&"<div>".repeat(100_000)), 100_000);
    }
}
