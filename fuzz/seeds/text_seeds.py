#!/usr/bin/env python3
"""Writes the seed corpus of the text-shaped fuzz targets (fuzz/corpus/NAME/seed-*).

The binary formats' seeds (stat cache, log objects, segments, stored indexes) come from the
real encoders: `cargo test -p caret-fuzz --test seeds -- --ignored`.
Run from the repository root: python3 fuzz/seeds/text_seeds.py
"""
import json
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")


def write(name, seeds):
    d = os.path.join(ROOT, name)
    os.makedirs(d, exist_ok=True)
    for i, s in enumerate(seeds):
        if isinstance(s, str):
            s = s.encode()
        with open(os.path.join(d, f"seed-{i:02}"), "wb") as f:
            f.write(s)


RUST = b'use std::io;\n\n/// A server.\npub struct Server {\n    port: u16,\n}\n\nimpl Server {\n    pub fn new(port: u16) -> Self {\n        Server { port }\n    }\n\n    fn start(&self) {\n        println!("start");\n        listen(self.port);\n    }\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn starts() {}\n}\n'
PYTHON = b'import os\n\n\n@cache\ndef read_config(path):\n    """Read it."""\n    return os.path.join(path, "x")\n\n\nclass Loader(Base):\n    def load(self):\n        return read_config(".")\n\n    async def later(self):\n        await x\n'
JS = b'import { a } from "./a.js";\n\nexport function render(x) {\n  return `<div>${x}</div>`;\n}\n\nexport class View {\n  draw() { return render(1); }\n}\n'
TS = b'export interface Props { a: number }\nexport type Id = string;\nexport enum Color { Red, Green }\nexport function view(p: Props): Id { return String(p.a) }\nnamespace N { export const x = 1 }\n'
TSX = b'export const App = () => <div className="a">{items.map(i => <Item key={i} />)}</div>;\n'
GO = b'package main\n\nimport "fmt"\n\ntype Server struct{ port int }\n\nfunc (s *Server) Serve() error { return nil }\n\nfunc main() {\n\tfmt.Println((&Server{}).Serve())\n}\n'
JAVA = b'package a;\n\npublic class Main {\n    interface Shape { double area(); }\n    public static void main(String[] args) { System.out.println(1); }\n}\n'
C = b'#include <stdio.h>\n\nstatic int *lookup(const char *name) { return 0; }\nstruct point { int x, y; };\ntypedef struct point point_t;\nint main(void) { return *lookup("x"); }\n'
CPP = b'#include <vector>\nnamespace app {\ntemplate <typename T> class Box { public: T get() const { return v; } T v; };\n}\nint main() { app::Box<int> b; return b.get(); }\n'
CS = b'using System;\nnamespace App {\n  public class Program {\n    public static void Main(string[] args) { Console.WriteLine("x"); }\n  }\n}\n'
RUBY = b'module App\n  class Task\n    def run(x)\n      puts x\n    end\n  end\nend\n'
PHP = b'<?php\nnamespace App;\nfunction render($x) { return "<p>$x</p>"; }\nclass View { public function draw() { return render(1); } }\n'
MD = b'# Title\n\nSome text with `code`.\n\n## Section\n\n```rust\nfn main() {}\n```\n\n- a\n- b\n'
TEXT = b'Plain text.\n\nA second paragraph that goes on for a while, with words and words.\n'
PO = b'msgid "Hello"\nmsgstr "Hallo"\n\nmsgid "Bye"\nmsgstr "Tschuess"\n'

write("chunker", [bytes([i]) + s for i, s in enumerate(
    [RUST, PYTHON, JS, TS, TSX, GO, JAVA, C, CPP, CS, RUBY, PHP, MD, TEXT, PYTHON, PO])] +
    [bytes([0]) + RUST * 20, bytes([1]) + b"x = '" + b"a" * 3000 + b"'\n", bytes([13]) + b"\xe2\x80\x8b" * 500])

write("secrets", [
    'aws_access_key_id = "AKIAIOSFODNN7EXAMPLE"\n',
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF0qS\n-----END RSA PRIVATE KEY-----\n",
    'token = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"\npassword = "hunter2hunter2"\n',
    'SECRET_KEY = "9f8e7d6c5b4a39281706f5e4d3c2b1a0"\nslack = "xoxb-123456789012-1234567890123-abcdefghijabcdefghijabcd"\n',
    "nothing secret here\n",
])

LAZY_FILE = RUST.decode()
write("edit_formats", [
    b"\x01" + RUST + b"\x00" + b"<<<<<<< SEARCH\n        println!(\"start\");\n=======\n        println!(\"starting\");\n>>>>>>> REPLACE\n",
    b"\x02" + RUST + b"\x00" + b"--- a/src/a.rs\n+++ b/src/a.rs\n@@ -13,3 +13,3 @@\n     fn start(&self) {\n-        println!(\"start\");\n+        println!(\"go\");\n         listen(self.port);\n",
    b"\x03" + RUST + b"\x00" + b"// ... existing code ...\n    fn start(&self) {\n        println!(\"starting on {}\", self.port);\n        listen(self.port);\n    }\n// ... existing code ...\n",
    b"\x04" + RUST + b"\x00" + b"*** Begin Patch\n*** Update File: src/a.rs\n@@ fn start(&self) {\n-        println!(\"start\");\n+        println!(\"go\");\n*** End Patch\n",
    b"\x00" + PYTHON + b"\x00" + b"<<<<<<< SEARCH\n    def load(self):\n=======\n    def load(self, force=False):\n>>>>>>> REPLACE\n",
    b"\x00" + b"a\r\nb\r\nc\r\n" + b"\x00" + b"@@ -1,2 +1,2 @@\n a\n-b\n+B\n",
])

write("search_replace_one_place", [
    RUST + b"\x00" + b"        println!(\"start\");" + b"\x00" + b"        println!(\"go\");",
    b"a\nb\na\nb\n\x00a\nb\x00c",
    b"one\ntwo\nthree\n\x00two\x00",
    PYTHON + b"\x00" + b"    def load(self):\n        return read_config(\".\")" + b"\x00" + b"    def load(self):\n        return 1",
])

write("tokenizer", [
    b"hello\nworld\n##s\n##ing\nfn\nmain\n(\n)\n{\n}\n\xffhello worlds fn main() { helloing }",
    b"a\nb\n##a\n##b\n\xffabab ba \xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
    b"\xff" + b"x" * 300,
    b"[UNK]\n##\n\n\xff## ## [CLS]",
])

tokenizer_json = {
    "version": "1.0",
    "normalizer": {"type": "BertNormalizer", "lowercase": True, "strip_accents": None},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100,
              "vocab": {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "fn": 103, "main": 104, "##in": 105, "h": 106}},
}
write("tokenizer_json", [json.dumps(tokenizer_json), '{"model": {"type": "BPE"}}', "{}", "not json"])

write("ignore_files", [
    b"\x00a.rs\n", b"\x00*.py\n!b.py\n", b"\x01sub/\n", b"\x02**/*.md\n# comment\n\\#x\n",
    b"\x03*.txt\n", b"\x00[abc].rs\n/node_modules\n!.hidden\n", b"\x00\\\n**\n!**/\n",
])

def sse(events):
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"

openai = sse([
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me look."}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"pa"}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "th\": \"a.rs\"}"}}]}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}},
])
anthropic = "".join(f"event: {k}\ndata: {json.dumps(v)}\n\n" for k, v in [
    ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 12}}}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
    ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1", "name": "grep"}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"pattern\": \"x\"}"}}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}}),
    ("message_stop", {"type": "message_stop"}),
])
write("model_streams", [b"\x00\x03" + openai.encode(), b"\x01\x02" + anthropic.encode(),
                        b"\x00\x00data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":4000000000,\"function\":{\"name\":\"x\"}}]}}]}\n\n",
                        b"\x01\x00event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"slow\"}}\n\n"])

write("local_tool_calls", [
    'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.rs"}}\n</tool_call>\n<tool_call>\n{"name": "grep", "arguments": {"pattern": "<tool_call>?"}}\n</tool_call>',
    '```json\n{"name": "ls", "arguments": {}}\n```',
    '{"name": "nope", "arguments": {}}',
    "a <tool_call>oops</tool_call> b <tool_call>{\"na",
    "plain answer",
])

commit = {"files": [], "deletes": [], "chunks": []}
search = {"query": "retry uploads", "k": 5, "mode": "hybrid"}
write("http_api", [
    bytes([0, 0, 0]) + b"\x00",
    bytes([1, 0, 0]) + b"\x00",
    bytes([1, 2, 0]) + b"\x00" + json.dumps({"key_id": "kkkkkkkkkkkkkkkk"}).encode(),
    bytes([2, 1, 0]) + b"\x00" + b'{"dirs": [""]}',
    bytes([3, 1, 0]) + b"\x00" + b'{"files": []}',
    bytes([4, 1, 0]) + b"\x00" + json.dumps(commit).encode(),
    bytes([5, 0, 0]) + b"10\x00",
    bytes([6, 1, 0]) + b"\x00" + b'{"chunks": [{"id": "00", "context": [], "text": "x"}]}',
    bytes([7, 1, 0]) + b"\x00" + json.dumps(search).encode(),
    bytes([7, 1, 1]) + b"\x00" + json.dumps(search).encode(),
    bytes([8, 1, 0]) + b"\x00" + json.dumps({"path": "a.rs", "text": "a\n", "edit": "<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n"}).encode(),
    bytes([9, 1, 0]) + b"\x00" + b'{"prefix": "fn ", "suffix": ""}',
    bytes([10, 1, 0]) + b"\x00" + b'{"model": "m", "messages": []}',
    bytes([11, 1, 0]) + b"\x00" + b'{"workspace": "w"}',
    bytes([13, 1, 0]) + b"\x00" + b'{"prompt": "x"}',
    bytes([16, 2, 0]) + b"name\x00" + b'{"value": "v"}',
    bytes([18, 0, 0]) + b"\x00",
    bytes([1, 3, 4]) + b"\x00",
])
