//! Keeps the layout honest: every crate in ARCHITECTURE.md's codemap, every module with its
//! `//!` paragraph, no import loops between a crate's modules, size limits on the binary, the
//! library crates and single files, no axum below the server, no test that prints and
//! returns early instead of skipping, and `unsafe` code in one audited place only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the workspace root")
}

/// Crate names (= folder names) under `crates/`.
fn crates() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root().join("crates"))
        .expect("reading crates/")
        .map(|e| e.expect("a crates/ entry").file_name().to_string_lossy().into_owned())
        .filter(|name| root().join("crates").join(name).join("Cargo.toml").exists())
        .collect();
    out.sort();
    out
}

/// Every `.rs` file under `dir`, relative to it, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries {
            let path = e.expect("a directory entry").path();
            if path.is_dir() {
                walk(base, &path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path.strip_prefix(base).expect("under the base").to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A crate's root file: `lib.rs`, else `main.rs`.
fn crate_root(src: &Path) -> Option<PathBuf> {
    ["lib.rs", "main.rs"].iter().map(PathBuf::from).find(|f| src.join(f).exists())
}

/// The module path of a source file relative to `src/` (`a/b.rs` and `a/b/mod.rs` are
/// `a::b`); the crate root and binaries under `bin/` are not modules of the library.
fn module_of(file: &Path, root: &Path) -> Option<Vec<String>> {
    if file == root || file.starts_with("bin") {
        return None;
    }
    let mut parts: Vec<String> = file.with_extension("").iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    Some(parts)
}

/// Source text without comments or string literals (so a path in a doc comment or a
/// message is not an import).
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            // A char literal such as '{' (lifetimes have no closing quote two bytes on).
            i += 3;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths a file names through `crate::`, `super::` or `self::`, each as its leading
/// keyword and segments (a `{…}` group expands to one path per member, two segments deep).
fn named_paths(code: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts = ["crate", "super", "self"].iter().find(|kw| {
            let n = kw.len();
            chars[i..].iter().take(n).copied().eq(kw.chars())
                && (i == 0 || !is_ident(chars[i - 1]))
                && chars.get(i + n) == Some(&':')
                && chars.get(i + n + 1) == Some(&':')
        });
        let Some(kw) = starts else {
            i += 1;
            continue;
        };
        i += kw.len();
        let mut segments = Vec::new();
        let mut group = None;
        while chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
            i += 2;
            if chars.get(i) == Some(&'{') {
                let start = i + 1;
                let mut depth = 1;
                i += 1;
                while i < chars.len() && depth > 0 {
                    match chars[i] {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    i += 1;
                }
                group = Some(chars[start..i.saturating_sub(1)].iter().collect::<String>());
                break;
            }
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            if start == i {
                break;
            }
            segments.push(chars[start..i].iter().collect::<String>());
        }
        match group {
            Some(g) => {
                for member in split_top_level(&g) {
                    let member: Vec<String> = member
                        .split("::")
                        .map(|s| s.chars().filter(|c| is_ident(*c)).collect::<String>())
                        .filter(|s| !s.is_empty())
                        .take(2)
                        .collect();
                    let mut path = segments.clone();
                    if member.first().is_some_and(|m| m != "self") {
                        path.extend(member);
                    }
                    out.push(((*kw).to_owned(), path));
                }
            }
            None => out.push(((*kw).to_owned(), segments)),
        }
    }
    out
}

/// `a, b::{c, d}, e` split at the commas outside braces.
fn split_top_level(group: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out
}

/// Module → modules it names, within one crate (the crate root is its table of contents and
/// takes no part: it declares modules and re-exports their items).
fn module_graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let Some(root) = crate_root(src) else { return BTreeMap::new() };
    let modules: BTreeMap<Vec<String>, PathBuf> =
        rust_files(src).into_iter().filter_map(|f| module_of(&f, &root).map(|m| (m, f))).collect();
    let resolve = |path: &[String]| -> Option<Vec<String>> {
        (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| modules.contains_key(p))
    };
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let mut edges = BTreeSet::new();
        for (kw, segments) in named_paths(&code_only(&read(&src.join(file)))) {
            let full: Vec<String> = match kw.as_str() {
                "crate" => segments,
                "super" => {
                    let mut ups = 1;
                    let mut rest = segments.as_slice();
                    while rest.first().is_some_and(|s| s == "super") {
                        ups += 1;
                        rest = &rest[1..];
                    }
                    let base = &module[..module.len().saturating_sub(ups)];
                    base.iter().cloned().chain(rest.iter().cloned()).collect()
                }
                _ => module.iter().cloned().chain(segments).collect(),
            };
            if let Some(target) = resolve(&full).filter(|t| t != module) {
                edges.insert(target);
            }
        }
        graph.insert(module.clone(), edges);
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan).
fn loops(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a [String], (usize, usize)>,
        stack: Vec<&'a [String]>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a [String]) {
        s.index.insert(v, (s.next, s.next));
        s.next += 1;
        s.stack.push(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w.as_slice()) {
                visit(s, w);
                let low = s.index[w.as_slice()].1.min(s.index[v].1);
                s.index.get_mut(v).expect("visited").1 = low;
            } else if s.stack.contains(&w.as_slice()) {
                let low = s.index[w.as_slice()].0.min(s.index[v].1);
                s.index.get_mut(v).expect("visited").1 = low;
            }
        }
        if s.index[v].0 == s.index[v].1 {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                component.push(if w.is_empty() { "(root)".to_owned() } else { w.join("::") });
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State { graph, index: BTreeMap::new(), stack: Vec::new(), next: 0, found: Vec::new() };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_slice()) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn every_crate_is_in_the_codemap() {
    let architecture = read(&root().join("ARCHITECTURE.md"));
    let missing: Vec<String> = crates().into_iter().filter(|c| !architecture.contains(&format!("`{c}`"))).collect();
    assert!(missing.is_empty(), "crates missing from ARCHITECTURE.md's codemap: {missing:?}");
}

#[test]
fn every_module_says_what_it_is_for() {
    let mut missing = Vec::new();
    for c in crates() {
        let src = root().join("crates").join(&c).join("src");
        for file in rust_files(&src) {
            let text = read(&src.join(&file));
            let first = text.lines().find(|l| !l.trim().is_empty() && !l.starts_with("#!")).unwrap_or("");
            if !first.starts_with("//!") {
                missing.push(format!("crates/{c}/src/{}", file.display()));
            }
        }
    }
    assert!(missing.is_empty(), "modules without a `//!` paragraph: {missing:#?}");
}

#[test]
fn modules_of_a_crate_import_each_other_without_loops() {
    let mut found = Vec::new();
    for c in crates() {
        for component in loops(&module_graph(&root().join("crates").join(&c).join("src"))) {
            found.push(format!("{c}: {}", component.join(", ")));
        }
    }
    assert!(found.is_empty(), "import loops between modules: {found:#?}");
}

#[test]
fn the_loop_finder_finds_loops() {
    let dir = caret_test_support::TempDir::new();
    dir.write("src/lib.rs", "//! A crate.\nmod a;\nmod b;\nmod c;\n");
    dir.write("src/a.rs", "//! A.\nuse crate::b::B;\n");
    dir.write("src/b.rs", "//! B.\nuse crate::{c::C, x};\n");
    dir.write("src/c.rs", "//! C.\n// use crate::a; is a comment\nfn f() { let _ = \"crate::a\"; super::a::f(); }\n");
    let graph = module_graph(&dir.path().join("src"));
    assert_eq!(loops(&graph), vec![vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]]);
    dir.write("src/c.rs", "//! C.\nfn f() {}\n");
    assert_eq!(loops(&module_graph(&dir.path().join("src"))), Vec::<Vec<String>>::new());
}

/// Lines of a file that are not tests: up to a `#[cfg(test)]` module at the top level; a
/// `tests.rs` file (or one under `tests/`) counts nothing.
fn non_test_lines(file: &Path, text: &str) -> usize {
    if file.file_name().is_some_and(|n| n == "tests.rs") || file.iter().any(|p| p == "tests") {
        return 0;
    }
    let lines: Vec<&str> = text.lines().collect();
    let cut = lines
        .windows(2)
        .position(|w| w[0].trim_end() == "#[cfg(test)]" && w[1].starts_with("mod "))
        .unwrap_or(lines.len());
    lines[..cut].len()
}

#[test]
fn crates_and_files_stay_within_their_size() {
    let mut over = Vec::new();
    for c in crates() {
        let src = root().join("crates").join(&c).join("src");
        let mut total = 0;
        for file in rust_files(&src) {
            let n = non_test_lines(&file, &read(&src.join(&file)));
            if n > 1_000 {
                over.push(format!("crates/{c}/src/{}: {n} lines (at most 1,000)", file.display()));
            }
            total += n;
        }
        let limit = if c == "caret" { 3_500 } else { 6_000 };
        if total > limit {
            over.push(format!("{c}: {total} lines (at most {limit})"));
        }
    }
    assert!(over.is_empty(), "too big: {over:#?}");
}

/// The workspace crates a crate depends on (not dev-dependencies).
fn dependencies(c: &str) -> Vec<String> {
    let manifest = read(&root().join("crates").join(c).join("Cargo.toml"));
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            in_deps = line.trim() == "[dependencies]";
        } else if in_deps && let Some(name) = line.split(['.', ' ', '=']).next().filter(|n| !n.is_empty()) {
            out.push(name.to_owned());
        }
    }
    out
}

#[test]
fn nothing_below_the_server_speaks_http_and_the_client_needs_no_server() {
    let mut below = BTreeSet::new();
    let mut todo = vec!["caret-server".to_owned()];
    while let Some(c) = todo.pop() {
        for d in dependencies(&c).into_iter().filter(|d| d.starts_with("caret-")) {
            if below.insert(d.clone()) {
                todo.push(d);
            }
        }
    }
    let axum: Vec<&String> = below.iter().filter(|c| dependencies(c).iter().any(|d| d == "axum")).collect();
    assert!(axum.is_empty(), "crates below caret-server that depend on axum: {axum:?}");
    assert!(!dependencies("caret-client").iter().any(|d| d == "caret-server"), "caret-client depends on caret-server");
}

#[test]
fn no_test_prints_and_returns_instead_of_skipping() {
    let mut found = Vec::new();
    for c in crates() {
        let tests = root().join("crates").join(&c).join("tests");
        for file in rust_files(&tests) {
            let text = read(&tests.join(&file));
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                if line.contains("eprintln!") && lines[i + 1..].iter().take(3).any(|l| l.trim() == "return;") {
                    found.push(format!("crates/{c}/tests/{}:{}", file.display(), i + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "tests that print and return early (use caret_test_support::skip): {found:?}");
}

/// The one place `unsafe` code is allowed (the workspace denies it): a system call no safe
/// binding offers. Anything more is a decision to make here, not in passing.
const UNSAFE_ALLOWED: &[&str] = &["crates/caret-host/src/runtime.rs"];

#[test]
fn unsafe_code_is_allowed_in_one_audited_place_only() {
    let mut found = Vec::new();
    for c in crates() {
        let dir = root().join("crates").join(&c);
        for sub in ["src", "tests", "benches", "examples"] {
            for file in rust_files(&dir.join(sub)) {
                let name = format!("crates/{c}/{sub}/{}", file.display());
                let code = code_only(&read(&dir.join(sub).join(&file)));
                let allows = code.matches("allow(unsafe_code)").count();
                let blocks = code.matches("unsafe {").count() + code.matches("unsafe fn").count();
                if (allows > 0 || blocks > 0) && !UNSAFE_ALLOWED.contains(&name.as_str()) {
                    found.push(name);
                }
            }
        }
    }
    assert!(found.is_empty(), "unsafe code outside {UNSAFE_ALLOWED:?}: {found:?}");
    let cargo = read(&root().join("Cargo.toml"));
    assert!(cargo.contains("unsafe_code = \"deny\""), "the workspace denies unsafe code");
    for place in UNSAFE_ALLOWED {
        let code = code_only(&read(&root().join(place)));
        assert_eq!(code.matches("allow(unsafe_code)").count(), 1, "{place}: one function allows unsafe code");
        assert_eq!(code.matches("unsafe {").count(), 1, "{place}: one unsafe block");
    }
}
