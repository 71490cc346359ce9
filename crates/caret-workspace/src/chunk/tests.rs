//! The chunker on every language, with snapshots of where it cuts.

use std::sync::Arc;

use expect_test::{Expect, expect};

use super::*;
use crate::tokens::Estimate;

fn chunker(max_tokens: usize, min_tokens: usize) -> Chunker {
    Chunker::new(ChunkConfig { max_tokens, min_tokens }, Arc::new(Estimate))
}

/// Renders chunks as `start-end [context] first line of text`.
fn render(path: &str, text: &str, chunker: &Chunker) -> String {
    let chunks = chunker.chunk(&RelPath::from_bytes(path), text);
    check_invariants(text, &chunks, chunker);
    chunks
        .iter()
        .map(|c| {
            let ctx = if c.context.is_empty() { String::new() } else { format!(" [{}]", c.context.join(" > ")) };
            let first = c.text(text).lines().next().unwrap_or_default().trim();
            format!("{}-{}{ctx} {first}\n", c.start_line, c.end_line)
        })
        .collect()
}

/// Every chunk is within budget; chunks are ordered and disjoint; every non-blank line is in a
/// chunk; byte and line ranges agree.
fn check_invariants(text: &str, chunks: &[Chunk], chunker: &Chunker) {
    let mut covered = vec![false; text.lines().count()];
    let mut prev_end = 0;
    for c in chunks {
        assert!(c.tokens as usize <= chunker.config.max_tokens, "chunk over budget: {c:?}");
        assert!(c.bytes.start >= prev_end, "chunks overlap or are out of order: {c:?}");
        assert!(!c.text(text).trim().is_empty(), "empty chunk {c:?}");
        prev_end = c.bytes.end;
        let start_line = text[..c.bytes.start].matches('\n').count() + 1;
        assert_eq!(start_line as u32, c.start_line, "{c:?}");
        for line in c.start_line..=c.end_line {
            covered[line as usize - 1] = true;
        }
    }
    for (i, line) in text.lines().enumerate() {
        assert!(covered[i] || line.trim().is_empty(), "line {} not in any chunk: {line:?}", i + 1);
    }
}

fn check(path: &str, text: &str, expect: Expect) {
    expect.assert_eq(&render(path, text, &chunker(80, 16)));
}

#[test]
fn rust() {
    check(
        "src/store.rs",
        r#"use std::collections::HashMap;

/// A key-value store.
pub struct Store {
    items: HashMap<String, String>,
}

impl Store {
    /// Creates an empty store.
    pub fn new() -> Self {
        Store { items: HashMap::new() }
    }

    /// Inserts a value, returning the old one.
    pub fn insert(&mut self, key: &str, value: &str) -> Option<String> {
        let old = self.items.insert(key.to_owned(), value.to_owned());
        tracing::debug!(key, "inserted");
        old
    }

    /// Retries a failed upload with exponential backoff until the deadline passes.
    pub fn retry_upload(&self, attempts: u32) -> Result<(), Error> {
        let mut delay = Duration::from_millis(100);
        for attempt in 0..attempts {
            match self.upload() {
                Ok(()) => return Ok(()),
                Err(e) if attempt + 1 == attempts => return Err(e),
                Err(_) => std::thread::sleep(delay),
            }
            delay *= 2;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn empty() {
        assert!(Store::new().items.is_empty());
    }
}
"#,
        expect![[r#"
            1-6 use std::collections::HashMap;
            8-12 impl Store {
            14-15 /// Inserts a value, returning the old one.
            16-19 [pub fn insert(&mut self, key: &str, value: &str) ->…] let old = self.items.insert(key.to_owned(), value.to_owned());
            21-21 [impl Store {] /// Retries a failed upload with exponential backoff until the deadline passes.
            22-23 pub fn retry_upload(&self, attempts: u32) -> Result<(), Error> {
            24-26 [pub fn retry_upload(&self, attempts: u32) -> Res…] for attempt in 0..attempts {
            27-31 [pub fn retry_upload(&self, attempts: u32) -> Res…] Err(e) if attempt + 1 == attempts => return Err(e),
            32-34 [pub fn retry_upload(&self, attempts: u32) -> Res…] Ok(())
            36-42 #[cfg(test)]
        "#]],
    );
}

#[test]
fn python() {
    check(
        "pkg/client.py",
        r#"import time


class Client:
    """An HTTP client with retries."""

    def __init__(self, base_url, retries=3):
        self.base_url = base_url
        self.retries = retries

    @staticmethod
    def backoff(attempt):
        return min(30.0, 0.5 * 2 ** attempt)

    def get(self, path):
        for attempt in range(self.retries):
            try:
                return self._send("GET", self.base_url + path)
            except ConnectionError:
                time.sleep(self.backoff(attempt))
        raise RuntimeError("all retries failed for " + path)


def main():
    print(Client("http://localhost").get("/"))
"#,
        expect![[r#"
            1-5 import time
            7-9 [class Client:] def __init__(self, base_url, retries=3):
            11-13 [class Client:] @staticmethod
            15-16 [class Client:] def get(self, path):
            17-20 [class Client: > def get(self, path):] try:
            21-21 [class Client: > def get(self, path):] raise RuntimeError("all retries failed for " + path)
            24-25 def main():
        "#]],
    );
}

#[test]
fn javascript_and_typescript() {
    check(
        "web/app.js",
        r#"import { render } from "./render.js";

// Keeps a running total.
export class Counter {
  constructor(start = 0) {
    this.value = start;
  }

  increment(by = 1) {
    this.value += by;
    render(this.value);
    return this.value;
  }
}

function debounce(fn, ms) {
  let timer;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}
"#,
        expect![[r#"
            1-1 import { render } from "./render.js";
            3-14 // Keeps a running total.
            16-22 function debounce(fn, ms) {
        "#]],
    );
    check(
        "web/api.ts",
        r#"export interface User {
  id: number;
  name: string;
  email?: string;
}

export type Handler = (user: User) => Promise<void>;

export async function fetchUser(id: number): Promise<User> {
  const response = await fetch(`/api/users/${id}`);
  if (!response.ok) {
    throw new Error(`failed to fetch user ${id}: ${response.status}`);
  }
  return (await response.json()) as User;
}
"#,
        expect![[r#"
            1-5 export interface User {
            7-7 export type Handler = (user: User) => Promise<void>;
            9-10 export async function fetchUser(id: number): Promise<User> {
            11-13 [export async function fetchUser(id: number): Promise<User> {] if (!response.ok) {
            14-15 [export async function fetchUser(id: number): Promise<User> {] return (await response.json()) as User;
        "#]],
    );
    check(
        "web/Button.tsx",
        r#"import React from "react";

type Props = { label: string; onClick: () => void };

export function Button({ label, onClick }: Props) {
  return (
    <button className="btn" onClick={onClick}>
      {label}
    </button>
  );
}
"#,
        expect![[r#"
            1-3 import React from "react";
            5-11 export function Button({ label, onClick }: Props) {
        "#]],
    );
}

#[test]
fn go_and_java() {
    check(
        "server/handler.go",
        r#"package server

import "net/http"

// Handler serves users.
type Handler struct {
	store Store
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	user, err := h.store.Find(r.URL.Query().Get("id"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	writeJSON(w, user)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
"#,
        expect![[r#"
            1-8 package server
            10-10 func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
            11-11 [func (h *Handler) ServeHTTP(w http.ResponseWriter, …] user, err := h.store.Find(r.URL.Query().Get("id"))
            12-17 [func (h *Handler) ServeHTTP(w http.ResponseWriter, …] if err != nil {
            19-22 func writeJSON(w http.ResponseWriter, v any) {
        "#]],
    );
    check(
        "src/main/java/com/example/Cache.java",
        r#"package com.example;

import java.util.HashMap;
import java.util.Map;

public class Cache<K, V> {
    private final Map<K, V> entries = new HashMap<>();
    private final int capacity;

    public Cache(int capacity) {
        this.capacity = capacity;
    }

    /** Returns the cached value or computes and stores it. */
    public V getOrCompute(K key, java.util.function.Function<K, V> compute) {
        V value = entries.get(key);
        if (value == null) {
            value = compute.apply(key);
            if (entries.size() < capacity) {
                entries.put(key, value);
            }
        }
        return value;
    }
}
"#,
        expect![[r#"
            1-4 package com.example;
            6-8 public class Cache<K, V> {
            10-12 [public class Cache<K, V> {] public Cache(int capacity) {
            14-14 [public V getOrCompute(K key, java.util.function.Functi…] /** Returns the cached value or computes and stores it. */
            15-16 public V getOrCompute(K key, java.util.function.Function<K, V> compute) {
            17-22 [public V getOrCompute(K key, java.util.function.Functi…] if (value == null) {
            23-25 [public V getOrCompute(K key, java.util.function.Functi…] return value;
        "#]],
    );
}

#[test]
fn c_cpp_and_csharp() {
    check(
        "src/buf.c",
        r#"#include <stdlib.h>
#include <string.h>

struct buf {
    char *data;
    size_t len, cap;
};

/* Grows the buffer to hold at least `need` more bytes. */
static int buf_grow(struct buf *b, size_t need) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + need) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

int buf_append(struct buf *b, const char *s, size_t n) {
    if (buf_grow(b, n)) return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}
"#,
        expect![[r#"
            1-2 #include <stdlib.h>
            4-7 struct buf {
            9-10 /* Grows the buffer to hold at least `need` more bytes. */
            11-13 [static int buf_grow(struct buf *b, size_t need) {] size_t cap = b->cap ? b->cap : 64;
            14-18 [static int buf_grow(struct buf *b, size_t need) {] if (!p) return -1;
            20-25 int buf_append(struct buf *b, const char *s, size_t n) {
        "#]],
    );
    check(
        "src/queue.hpp",
        r#"#pragma once
#include <deque>
#include <mutex>

namespace caret {

template <typename T>
class Queue {
public:
    void push(T value) {
        std::lock_guard<std::mutex> lock(mutex_);
        items_.push_back(std::move(value));
    }

    bool try_pop(T& out) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (items_.empty()) return false;
        out = std::move(items_.front());
        items_.pop_front();
        return true;
    }

private:
    std::deque<T> items_;
    std::mutex mutex_;
};

}  // namespace caret
"#,
        expect![[r#"
            1-3 #pragma once
            5-9 namespace caret {
            10-13 [namespace caret { > class Queue {] void push(T value) {
            15-17 [namespace caret { > class Queue {] bool try_pop(T& out) {
            18-21 [namespace caret { > class Queue { > bool try_pop(T& out) {] out = std::move(items_.front());
            23-26 [namespace caret { > class Queue {] private:
            28-28 }  // namespace caret
        "#]],
    );
    check(
        "Services/Greeter.cs",
        r#"using System;

namespace Demo.Services
{
    public class Greeter
    {
        private readonly string _name;

        public Greeter(string name)
        {
            _name = name ?? throw new ArgumentNullException(nameof(name));
        }

        public string Greet(DateTime now)
        {
            var part = now.Hour < 12 ? "morning" : now.Hour < 18 ? "afternoon" : "evening";
            return $"Good {part}, {_name}!";
        }
    }
}
"#,
        expect![[r#"
            1-5 using System;
            6-12 [namespace Demo.Services { > public class Greeter {] {
            14-14 [public class Greeter {] public string Greet(DateTime now)
            15-18 [public class Greeter { > public string Greet(DateTime now) {] {
            19-20 [namespace Demo.Services { > public class Greeter {] }
        "#]],
    );
}

#[test]
fn ruby_and_php() {
    check(
        "lib/invoice.rb",
        r#"require "bigdecimal"

module Billing
  class Invoice
    attr_reader :lines

    def initialize
      @lines = []
    end

    def add(description, amount)
      @lines << { description: description, amount: BigDecimal(amount.to_s) }
      self
    end

    def total
      @lines.sum { |line| line[:amount] }
    end
  end
end
"#,
        expect![[r#"
            1-4 require "bigdecimal"
            5-9 [module Billing > class Invoice] attr_reader :lines
            11-14 [module Billing > class Invoice] def add(description, amount)
            16-19 [module Billing > class Invoice] def total
            20-20 [module Billing] end
        "#]],
    );
    check(
        "src/Repository.php",
        r#"<?php

namespace App;

class Repository
{
    private array $items = [];

    public function save(string $id, array $data): void
    {
        $this->items[$id] = $data;
    }

    public function find(string $id): ?array
    {
        return $this->items[$id] ?? null;
    }
}

function helper(): string
{
    return "help";
}
"#,
        expect![[r#"
            1-7 <?php
            9-12 [class Repository {] public function save(string $id, array $data): void
            14-18 [class Repository {] public function find(string $id): ?array
            20-23 function helper(): string
        "#]],
    );
}

#[test]
fn markdown_by_headings() {
    check(
        "docs/guide.md",
        r#"# Guide

Caret indexes your code.

## Install

Run the setup script. It installs the system packages, builds the binary and pulls the
default models into the data directory so that everything works offline afterwards.

```sh
# not a heading: inside a fence
./scripts/setup.sh
```

## Usage

### Scan

`caret scan` shows what would be indexed.

### Search

`caret search` finds code.
"#,
        expect![[r#"
            1-3 # Guide
            5-8 [# Guide] ## Install
            10-13 [# Guide > ## Install] ```sh
            15-19 [# Guide] ## Usage
            21-23 [# Guide > ## Usage] ### Search
        "#]],
    );
}

#[test]
fn a_markdown_code_block_with_blank_lines_stays_whole_where_it_fits() {
    let text = "# API\n\n## load\n\nLoads a file and returns its settings.\n\n```python\nimport lib\n\nsettings = \
                lib.load(\"a.toml\", strict=True, merge=False)\n\nprint(settings)\n```\n";
    expect![[r#"
        1-5 # API
        7-13 [# API > ## load] ```python
    "#]]
    .assert_eq(&render("docs/api.md", text, &chunker(56, 4)));
}

#[test]
fn plain_text_by_paragraphs_and_long_lines_by_words() {
    let long_line = "word ".repeat(200);
    let text = format!("first paragraph line one\nline two\n\nsecond paragraph\n\n{long_line}\n");
    expect![[r#"
        1-4 first paragraph line one
        6-6 word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word
        6-6 word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word
        6-6 word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word
        6-6 word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word
        6-6 word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word
        6-6 word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word
        6-6 word word word word word word word word word word word word word word
    "#]].assert_eq(&render("notes.txt", &text, &chunker(64, 16)));
    // A single word longer than the budget is cut by characters.
    let blob = "x".repeat(1000);
    let chunks = chunker(64, 16).chunk(&RelPath::from_bytes("data.txt"), &blob);
    check_invariants(&blob, &chunks, &chunker(64, 16));
    assert_eq!(chunks.iter().map(|c| c.bytes.len()).sum::<usize>(), 1000);
}

#[test]
fn invariants_hold_on_real_sources_and_odd_input() {
    let chunker = chunker(96, 24);
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    let mut files = 0;
    for entry in std::fs::read_dir(src).unwrap().chain(std::fs::read_dir(format!("{src}/chunk")).unwrap()) {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            let chunks = chunker.chunk(&RelPath::from_bytes("x.rs"), &text);
            check_invariants(&text, &chunks, &chunker);
            files += 1;
        }
    }
    assert!(files >= 5);
    let mut rng = fastrand::Rng::with_seed(7);
    let alphabet: Vec<char> = "abc xyz(){};\n\n\t\"é的#/*".chars().collect();
    for (i, lang) in ["a.rs", "a.py", "a.js", "a.go", "a.c", "a.md", "a.txt", "a.rb", "a.php"].iter().enumerate() {
        for _ in 0..20 {
            let len = rng.usize(0..2000);
            let text: String = (0..len).map(|_| alphabet[rng.usize(0..alphabet.len())]).collect();
            let chunks = chunker.chunk(&RelPath::from_bytes(*lang), &text);
            check_invariants(&text, &chunks, &chunker);
        }
        assert!(i < 9);
    }
    for text in ["", "\n\n\n", "   ", "fn", "\r\n\r\nfn main() {}\r\n"] {
        let chunks = chunker.chunk(&RelPath::from_bytes("a.rs"), text);
        check_invariants(text, &chunks, &chunker);
    }
}

#[test]
fn chunks_record_metadata_and_stable_hashes() {
    let text = "fn a() {}\n";
    let c = chunker(64, 16).chunk(&RelPath::from_bytes("src/lib.rs"), text);
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].language, c[0].kind, c[0].bytes.clone(), c[0].start_line, c[0].end_line),
        (Language::Rust, FileKind::Code, 0..9, 1, 1)
    );
    let again = chunker(64, 16).chunk(&RelPath::from_bytes("other/place.rs"), text);
    assert_eq!(c[0].hash, again[0].hash, "the hash depends on content, not on the path");
    let t = chunker(64, 16).chunk(&RelPath::from_bytes("tests/it.rs"), text);
    assert_eq!(t[0].kind, FileKind::Test);
}

#[test]
fn every_grammar_loads() {
    for lang in Language::SYNTAX {
        let mut parser = tree_sitter::Parser::new();
        parser.set_language(&lang.grammar().unwrap()).unwrap_or_else(|e| panic!("{lang:?}: {e}"));
    }
}

/// Each chunk names what it defines — not what it calls — across languages; a definition's
/// name is counted in the chunk that holds it.
#[test]
fn chunks_name_the_definitions_they_hold() {
    let defined = |path: &str, text: &str| -> Vec<Vec<String>> {
        let chunks = chunker(40, 8).chunk(&RelPath::from_bytes(path), text);
        for c in &chunks {
            for name in &c.defines {
                assert!(c.text(text).contains(name.as_str()), "{name} is in its chunk: {c:?}");
            }
        }
        chunks.into_iter().map(|c| c.defines).collect()
    };
    let rust = "pub struct Queue {\n    items: Vec<u32>,\n}\n\nimpl Queue {\n    pub fn steal_into(&self, other: &Queue) -> usize {\n        other.items.len() + helper()\n    }\n}\n\nfn helper() -> usize {\n    1\n}\n";
    let mut all: Vec<String> = defined("src/queue.rs", rust).concat();
    all.dedup();
    assert_eq!(all, ["Queue", "steal_into", "helper"].map(String::from).to_vec());
    let python = "import os\n\n@cache\ndef read_config(path):\n    return os.path.join(path, 'x')\n\nclass Loader(Base):\n    def load(self):\n        return read_config('.')\n";
    assert_eq!(defined("pkg/loader.py", python).concat(), ["read_config", "Loader", "load"].map(String::from).to_vec());
    let go = "package main\n\ntype Server struct{}\n\nfunc (s *Server) Serve() error { return nil }\n\nfunc main() { (&Server{}).Serve() }\n";
    assert_eq!(defined("main.go", go).concat(), ["Server", "Serve", "main"].map(String::from).to_vec());
    let c = "static int *lookup(const char *name) { return 0; }\nint main(void) { return *lookup(\"x\"); }\n";
    assert_eq!(defined("a.c", c).concat(), ["lookup", "main"].map(String::from).to_vec());
    assert!(defined("README.md", "# Title\n\nText about `fn main`.\n").concat().is_empty());
}

/// A file's outermost definitions, not what they hold nor what they call.
#[test]
fn top_level_names_skip_nested_definitions() {
    let names = |path: &str, text: &str| -> Vec<String> {
        top_level_names(&RelPath::from_bytes(path), text).into_iter().map(|(n, _)| n).collect()
    };
    let python = "import os\n\n@cache\ndef read_config(path):\n    def inner():\n        pass\n    return os.path.join(path, 'x')\n\nclass Loader(Base):\n    def load(self):\n        return read_config('.')\n\nif os.name == 'nt':\n    def read_config(path):\n        return path\n";
    assert_eq!(names("pkg/loader.py", python), ["read_config", "Loader"]);
    let rust = "pub struct Queue {\n    items: Vec<u32>,\n}\n\nimpl Queue {\n    pub fn steal_into(&self) -> usize { helper() }\n}\n\nfn helper() -> usize {\n    fn nested() {}\n    1\n}\n\nmod tests {\n    fn case() {}\n}\n";
    assert_eq!(names("src/queue.rs", rust), ["Queue", "helper", "tests"]);
    let ts = "export function render(x: number) { return x }\nexport class View { draw() {} }\ninterface Props { a: number }\n";
    assert_eq!(names("src/view.ts", ts), ["render", "View", "Props"]);
    assert!(names("README.md", "# Title\n\nfn main\n").is_empty());
    assert!(
        names("pkg/broken.py", "def (:\n\x00\x01").iter().all(|n| !n.is_empty()),
        "a broken file gives what parses"
    );
}

#[test]
fn files_are_classified_by_what_they_are_for() {
    let kind = |p: &str| {
        let path = RelPath::from_bytes(p);
        FileKind::detect(&path, Language::detect(&path))
    };
    assert_eq!(kind("src/_pytest/fixtures.py"), FileKind::Code);
    assert_eq!(kind("testing/python/fixtures.py"), FileKind::Test, "pytest's own test directory");
    assert_eq!(kind("testing/conftest.py"), FileKind::Test);
    assert_eq!(kind("src/runtime/time_alt/tests.rs"), FileKind::Test, "a Rust tests module");
    assert_eq!(kind("django/conf/locale/de/LC_MESSAGES/django.po"), FileKind::Data);
    assert_eq!(kind("data/prices.csv"), FileKind::Data);
    assert_eq!(kind("docs/intro.rst"), FileKind::Docs);
    assert_eq!(kind("pyproject.toml"), FileKind::Config);
    assert_eq!(kind("man/syncthing-bep.7"), FileKind::Docs, "a manual page");
    assert_eq!(kind("lib/discover/doc.go"), FileKind::Docs, "a Go package's documentation");
    assert_eq!(kind("src/main/org/h2/package-info.java"), FileKind::Docs);
    assert_eq!(kind("lib/discover/cache.go"), FileKind::Code);
    assert_eq!(kind("build/out.0"), FileKind::Code, "no manual section 0");
    assert_eq!(kind("src/docsrc/html/advanced.html"), FileKind::Docs, "a documentation site's page");
    assert_eq!(kind("gui/default/index.html"), FileKind::Code, "an application's page");
}

/// A generated file that nests thousands of constructs across lines (bundled JavaScript does)
/// is chunked by lines below a few dozen levels, within the budget, instead of overflowing
/// the stack with a descent per level.
#[test]
fn a_file_nested_thousands_deep_is_chunked_without_overflowing_the_stack() {
    let depth = 20_000;
    let mut text = String::from("var x =\n");
    for i in 0..depth {
        text.push_str(&format!("[{i},\n"));
    }
    text.push('0');
    text.push_str(&"]".repeat(depth));
    text.push_str(";\nfunction after() {\n  return x;\n}\n");
    let c = chunker(64, 16);
    // On a thread with the stack a scan's worker has (2 MiB), not the test harness's.
    let chunks = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let chunks = c.chunk(&RelPath::from_bytes("bundle.js"), &text);
            check_invariants(&text, &chunks, &c);
            (chunks.len(), chunks.last().map(|l| l.text(&text).contains("function after")))
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(chunks.0 > depth / 100, "{chunks:?}");
    assert_eq!(chunks.1, Some(true), "the code after the nesting is chunked too");
}
