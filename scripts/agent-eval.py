#!/usr/bin/env python3
"""Measure the agent's success rate on small real tasks with a local model.

Each task is a small repository (Python with unittest, or a Rust crate) written fresh into
--work, a request in plain words, and a check: the repository's own tests pass afterwards
(`python3 -m unittest` / `cargo test --offline`) and, for tasks that add something, the new
thing is there and tested. The agent runs as a user would run it: `caret exec "TASK" -C DIR
--approval never` (the default local model unless --model names another alias), one process
per task, its JSON-lines events kept in --work/NAME.events.jsonl.

    scripts/agent-eval.py [--caret BIN] [--model ALIAS] [--max-steps N] [--only NAME,...]
                          [--work DIR] [--timeout S]

Prints one line per task (success, model calls, tool calls, seconds) and the success rate.

    scripts/agent-eval.py --export DIR [--only NAME,...]

writes the same tasks as a rollout task file instead (DIR/tasks.jsonl, one committed git
repository per task under DIR/repos/, the check as each task's grader), for
`caret rollout DIR/tasks.jsonl`.
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

PY_CALC = '''def add(a, b):
    return a + b


def subtract(a, b):
    return a - b
'''

PY_CALC_TEST = '''import unittest

from calc import add, subtract


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_subtract(self):
        self.assertEqual(subtract(5, 3), 2)


if __name__ == "__main__":
    unittest.main()
'''

RUST_TOML = '''[package]
name = "shapes"
version = "0.1.0"
edition = "2021"

[workspace]
'''


def tasks():
    """(name, files, request, extra check: a python snippet run in the repo, or None)."""
    return [
        ("py-add-multiply", {"calc.py": PY_CALC, "test_calc.py": PY_CALC_TEST},
         "Add a function multiply(a, b) to calc.py that returns the product of a and b, and a test for it "
         "in test_calc.py.",
         "from calc import multiply; assert multiply(3, 4) == 12; "
         "assert 'multiply' in open('test_calc.py').read()"),
        ("py-fix-add", {"calc.py": PY_CALC.replace("return a + b", "return a - b"), "test_calc.py": PY_CALC_TEST},
         "The test test_add in test_calc.py fails. Fix the bug in calc.py.", None),
        ("py-fix-last-n", {
            "items.py": "def last_n(items, n):\n    \"\"\"The last n items of a list.\"\"\"\n"
                        "    return items[-n - 1:]\n",
            "test_items.py": "import unittest\n\nfrom items import last_n\n\n\nclass T(unittest.TestCase):\n"
                             "    def test_last_two(self):\n        self.assertEqual(last_n([1, 2, 3, 4], 2), [3, 4])\n\n\n"
                             "if __name__ == \"__main__\":\n    unittest.main()\n"},
         "test_last_two fails: last_n returns one item too many. Fix last_n in items.py.", None),
        ("py-add-is-even", {"utils.py": "def is_positive(n):\n    return n > 0\n",
                            "test_utils.py": "import unittest\n\nfrom utils import is_positive\n\n\n"
                                             "class T(unittest.TestCase):\n    def test_positive(self):\n"
                                             "        self.assertTrue(is_positive(3))\n\n\n"
                                             "if __name__ == \"__main__\":\n    unittest.main()\n"},
         "Add a function is_even(n) to utils.py that returns True when n is even, with a test in test_utils.py.",
         "from utils import is_even; assert is_even(4) and not is_even(7); "
         "assert 'is_even' in open('test_utils.py').read()"),
        ("py-fix-greet", {"greet.py": "def greet(name):\n    return 'Hello, ' + name\n",
                          "test_greet.py": "import unittest\n\nfrom greet import greet\n\n\nclass T(unittest.TestCase):\n"
                                           "    def test_greet(self):\n"
                                           "        self.assertEqual(greet('Ada'), 'Hello, Ada!')\n\n\n"
                                           "if __name__ == \"__main__\":\n    unittest.main()\n"},
         "The test in test_greet.py fails. Fix greet in greet.py so that it passes.", None),
        ("py-stack-len", {"stack.py": "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
                                      "    def push(self, x):\n        self.items.append(x)\n\n"
                                      "    def pop(self):\n        return self.items.pop()\n",
                          "test_stack.py": "import unittest\n\nfrom stack import Stack\n\n\nclass T(unittest.TestCase):\n"
                                           "    def test_push_pop(self):\n        s = Stack()\n        s.push(1)\n"
                                           "        self.assertEqual(s.pop(), 1)\n\n\n"
                                           "if __name__ == \"__main__\":\n    unittest.main()\n"},
         "Add a __len__ method to the Stack class in stack.py returning the number of items, and a test for it "
         "in test_stack.py.",
         "from stack import Stack; s = Stack(); s.push(1); s.push(2); assert len(s) == 2; "
         "assert 'len(' in open('test_stack.py').read()"),
        ("py-fix-average", {"stats.py": "def average(xs):\n    return sum(xs) / (len(xs) + 1)\n",
                            "test_stats.py": "import unittest\n\nfrom stats import average\n\n\n"
                                             "class T(unittest.TestCase):\n    def test_average(self):\n"
                                             "        self.assertEqual(average([2, 4, 6]), 4)\n\n\n"
                                             "if __name__ == \"__main__\":\n    unittest.main()\n"},
         "test_average fails. Fix average in stats.py.", None),
        ("py-add-reverse-words", {"text.py": "def shout(s):\n    return s.upper()\n",
                                  "test_text.py": "import unittest\n\nfrom text import shout\n\n\n"
                                                  "class T(unittest.TestCase):\n    def test_shout(self):\n"
                                                  "        self.assertEqual(shout('hi'), 'HI')\n\n\n"
                                                  "if __name__ == \"__main__\":\n    unittest.main()\n"},
         "Add a function reverse_words(s) to text.py that reverses the order of the words in a sentence "
         "('a b c' gives 'c b a'), and a test for it in test_text.py.",
         "from text import reverse_words; assert reverse_words('a b c') == 'c b a'; "
         "assert 'reverse_words' in open('test_text.py').read()"),
        ("rs-fix-double", {"Cargo.toml": RUST_TOML,
                           "src/lib.rs": "pub fn double(x: i32) -> i32 {\n    x + 2\n}\n\n#[cfg(test)]\nmod tests {\n"
                                         "    use super::*;\n\n    #[test]\n    fn doubles() {\n"
                                         "        assert_eq!(double(3), 6);\n    }\n}\n"},
         "The test `doubles` in src/lib.rs fails. Fix the function double.", None),
        ("rs-add-square", {"Cargo.toml": RUST_TOML,
                           "src/lib.rs": "pub fn double(x: i32) -> i32 {\n    x * 2\n}\n\n#[cfg(test)]\nmod tests {\n"
                                         "    use super::*;\n\n    #[test]\n    fn doubles() {\n"
                                         "        assert_eq!(double(3), 6);\n    }\n}\n"},
         "Add a public function square(x: i32) -> i32 to src/lib.rs returning x * x, and a test for it in the "
         "tests module.",
         "s = open('src/lib.rs').read(); assert 'pub fn square' in s and 'square(' in s.split('mod tests')[1]"),
    ]


def check(repo, extra):
    """Whether the repository's tests pass and the extra check holds."""
    if (repo / "Cargo.toml").exists():
        r = subprocess.run(["cargo", "test", "--offline", "--quiet"], cwd=repo, capture_output=True, timeout=600)
    else:
        r = subprocess.run([sys.executable, "-B", "-m", "unittest", "-q"], cwd=repo, capture_output=True, timeout=120)
    if r.returncode != 0:
        return False, (r.stdout + r.stderr).decode(errors="replace")[-400:]
    if extra:
        r = subprocess.run([sys.executable, "-B", "-c", extra], cwd=repo, capture_output=True, timeout=60)
        if r.returncode != 0:
            return False, r.stderr.decode(errors="replace")[-400:]
    return True, ""


def grader(repo_files, extra):
    """The shell command that makes `check`'s decision inside a run's sandbox."""
    if "Cargo.toml" in repo_files:
        command = "cargo test --offline --quiet 2>&1"
    else:
        command = "python3 -B -m unittest -q 2>&1"
    if extra:
        command += " && python3 -B -c " + shlex.quote(extra)
    return command


def export(chosen, out):
    """Writes the tasks as a rollout task file with one committed repository each."""
    if (out / "tasks.jsonl").exists():
        sys.exit(f"{out / 'tasks.jsonl'} exists already; give another directory")
    lines = []
    for name, files, request, extra in chosen:
        repo = out / "repos" / name
        shutil.rmtree(repo, ignore_errors=True)
        files = dict(files, **{".gitignore": "/target\n__pycache__/\n"})
        if "Cargo.toml" in files:
            # Committed, so that building does not add it to the attempt's patch.
            crate = files["Cargo.toml"].split('name = "')[1].split('"')[0]
            files["Cargo.lock"] = ("# This file is automatically @generated by Cargo.\n# It is not intended for manual "
                                   f"editing.\nversion = 4\n\n[[package]]\nname = \"{crate}\"\nversion = \"0.1.0\"\n")
        for path, text in files.items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text(text)
        git = ["git", "-c", "user.name=caret", "-c", "user.email=caret@localhost", "-c", "init.defaultBranch=main"]
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "task"]):
            subprocess.run(git + args, cwd=repo, check=True, capture_output=True)
        task = {"id": name, "repo": f"repos/{name}", "prompt": request,
                "grader": {"command": grader(files, extra), "timeout_s": 600}}
        lines.append(json.dumps(task) + "\n")
    # The task file last: its presence says the export finished.
    (out / "tasks.jsonl").write_text("".join(lines))
    print(f"{len(lines)} tasks → {out / 'tasks.jsonl'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--caret", default="caret")
    ap.add_argument("--model", help="a model alias (default: caret's `agent` alias, else the first)")
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--only", help="comma-separated task names")
    ap.add_argument("--work", default="/tmp/caret-agent-eval")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per task")
    ap.add_argument("--export", metavar="DIR", help="write the tasks as a rollout task file and stop")
    args = ap.parse_args()
    if args.export:
        chosen = [t for t in tasks() if not args.only or t[0] in args.only.split(",")]
        out = Path(args.export)
        out.mkdir(parents=True, exist_ok=True)
        export(chosen, out)
        return
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    chosen = [t for t in tasks() if not args.only or t[0] in args.only.split(",")]
    wins = 0
    for name, files, request, extra in chosen:
        repo = work / name
        for path, text in files.items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text(text)
        ok_before, _ = check(repo, None)
        cmd = [args.caret, "exec", request, "-C", str(repo), "--approval", "never", "--max-steps", str(args.max_steps)]
        if args.model:
            cmd += ["--model", args.model]
        started = time.time()
        try:
            r = subprocess.run(cmd, capture_output=True, timeout=args.timeout)
            out, err = r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            out, err = e.stdout or b"", b"timeout"
        seconds = time.time() - started
        (work / f"{name}.events.jsonl").write_bytes(out)
        events = [json.loads(l) for l in out.decode(errors="replace").splitlines() if l.startswith("{")]
        calls = sum(1 for e in events if e.get("type") == "token_usage")
        tools = [e["name"] for e in events if e.get("type") == "tool_call_begin"]
        ok, why = check(repo, extra)
        wins += ok
        note = "" if ok else f"  ({why.strip().splitlines()[-1] if why.strip() else err.decode(errors='replace')[-200:]})"
        print(f"{'PASS' if ok else 'FAIL'} {name:<22} model calls {calls:>2}  tools {len(tools):>2} "
              f"{','.join(sorted(set(tools)))}  {seconds:.0f} s{' (tests passed before!)' if ok_before and extra is None else ''}{note}",
              flush=True)
    print(f"success: {wins}/{len(chosen)} = {100 * wins / max(len(chosen), 1):.0f}%")


if __name__ == "__main__":
    main()
