#!/usr/bin/env python3
"""Builds the next-edit benchmark's set from a git repository's real history.

For each commit (no merges) and each source file it changed in two or more small hunks
(each at most 3 lines on either side, the two within 60 lines of each other), one case: an
excerpt of the file before the commit, the first hunk (what the user just did) and the
second (what comes next), their lines relative to the excerpt. `caret bench next-edit`
applies the first as the recent edit and asks for the next.

    scripts/next-edit-set.py [REPO] [--max 200] > crates/caret-bench/src/data/next-edit/caret-history.jsonl
"""

import argparse
import json
import re
import subprocess
import sys

EXTENSIONS = (".rs", ".py", ".ts", ".js", ".go", ".toml")
MAX_SIDE = 3
MAX_APART = 60
CONTEXT = 25


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def hunks(diff):
    """(old start, old lines, new lines) of each hunk of a `-U0` diff."""
    out = []
    for block in re.split(r"^@@ ", diff, flags=re.M)[1:]:
        head, _, body = block.partition("\n")
        m = re.match(r"-(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", head)
        if not m:
            continue
        old = [l[1:] for l in body.splitlines() if l.startswith("-")]
        new = [l[1:] for l in body.splitlines() if l.startswith("+")]
        start = int(m.group(1))
        # A pure insertion's old start names the line after which it goes.
        out.append((start if old else start + 1, old, new))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo", nargs="?", default=".")
    ap.add_argument("--max", type=int, default=200)
    a = ap.parse_args()
    cases = []
    for line in git(a.repo, "log", "--no-merges", "--reverse", "--format=%H %P").splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        commit, parent = parts
        files = git(a.repo, "diff", "--name-only", parent, commit).split()
        for path in files:
            if not path.endswith(EXTENSIONS):
                continue
            hs = hunks(git(a.repo, "diff", "-U0", parent, commit, "--", path))
            small = [h for h in hs if len(h[1]) <= MAX_SIDE and len(h[2]) <= MAX_SIDE and (h[1] or h[2])]
            for first, second in zip(small, small[1:]):
                if not (0 < second[0] - first[0] <= MAX_APART):
                    continue
                try:
                    before = git(a.repo, "show", f"{parent}:{path}").splitlines(keepends=True)
                except subprocess.CalledProcessError:
                    continue
                lo = max(1, first[0] - CONTEXT)
                hi = min(len(before), second[0] + len(second[1]) + CONTEXT)
                cases.append(
                    {
                        "commit": commit[:12],
                        "path": path,
                        "text": "".join(before[lo - 1 : hi]),
                        "first": {"line": first[0] - lo + 1, "old": first[1], "new": first[2]},
                        "next": {"line": second[0] - lo + 1, "old": second[1], "new": second[2]},
                    }
                )
                break
        if len(cases) >= a.max:
            break
    for c in cases[: a.max]:
        print(json.dumps(c))
    print(f"{min(len(cases), a.max)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
