#!/usr/bin/env python3
"""Evaluate `caret apply` on real history that nobody wrote for it.

For a pair of consecutive releases of a package on the Python package index, every text file
that changed is expressed as an edit in each format — a unified diff (3 lines of context),
search/replace blocks and a patch envelope (3 lines of context, more where a hunk's old text
occurs twice: both formats require a block to match one place), and a lazy snippet (3 lines
of context around each change, the rest elided with `... existing code ...` comments) — and
`caret apply` must turn the old file into the new release byte for byte.

    scripts/apply-eval.py PACKAGE OLD_VERSION NEW_VERSION [--caret BIN] [--work DIR] [--json OUT]

Sdists are downloaded once into --work (default /tmp/caret-apply-eval). Prints the exact-match
rate per format and the first failures.
"""

import argparse
import difflib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

TEXT_SUFFIXES = {".py", ".pyi", ".rs", ".js", ".ts", ".c", ".h", ".cpp", ".go", ".java", ".rb", ".sh",
                 ".toml", ".cfg", ".ini", ".txt", ".rst", ".md", ".html", ".css", ".yml", ".yaml"}
HASH_COMMENT = {".py", ".pyi", ".rb", ".sh", ".toml", ".cfg", ".ini", ".yml", ".yaml", ".txt", ".rst", ".md"}


def fetch(package, version, work):
    dest = work / f"{package}-{version}"
    if dest.exists():
        return dest
    # The package-level document (some mirrors serve only that); file URLs may be relative.
    index = f"https://pypi.org/pypi/{package}/json"
    meta = json.load(urllib.request.urlopen(index))
    sdist = next(u for u in meta["releases"][version] if u["packagetype"] == "sdist")
    archive = work / sdist["filename"]
    if not archive.exists():
        urllib.request.urlretrieve(urllib.parse.urljoin(index, sdist["url"]), archive)
    tmp = work / f".{package}-{version}.extract"
    tmp.mkdir(parents=True, exist_ok=True)
    if archive.suffix == ".zip":
        zipfile.ZipFile(archive).extractall(tmp)
    else:
        with tarfile.open(archive) as t:
            t.extractall(tmp, filter="data")
    (top,) = list(tmp.iterdir())
    top.rename(dest)
    tmp.rmdir()
    return dest


def comment(path):
    return "#" if path.suffix in HASH_COMMENT else "//"


def groups(old, new, context=3):
    return list(difflib.SequenceMatcher(None, old, new, autojunk=False).get_grouped_opcodes(context))


def occurrences(old, block):
    if not block:
        return 1
    first = block[0]
    return sum(1 for p in range(len(old) - len(block) + 1) if old[p] == first and old[p:p + len(block)] == block)


def unique_groups(old, new):
    """Hunks whose old lines occur once in the old file: the contract of search/replace
    blocks ("include enough lines to match uniquely") and of patch hunks. Context grows from 3
    lines, for the whole file, until every hunk is unique."""
    for context in range(3, 60):
        gs = groups(old, new, context)
        if all(occurrences(old, old[g[0][1]:g[-1][2]]) == 1 for g in gs):
            return gs
    return gs


def udiff(rel, old, new):
    return "".join(difflib.unified_diff([l + "\n" for l in old], [l + "\n" for l in new], f"a/{rel}", f"b/{rel}"))


def search_replace(gs, old, new):
    out = []
    for g in gs:
        i1, i2, j1, j2 = g[0][1], g[-1][2], g[0][3], g[-1][4]
        out.append("<<<<<<< SEARCH\n" + "".join(l + "\n" for l in old[i1:i2]) + "=======\n"
                   + "".join(l + "\n" for l in new[j1:j2]) + ">>>>>>> REPLACE\n")
    return "\n".join(out)


def patch(rel, gs, old, new):
    out = ["*** Begin Patch", f"*** Update File: {rel}"]
    for g in gs:
        out.append("@@")
        for tag, i1, i2, j1, j2 in g:
            if tag == "equal":
                out += [" " + l for l in old[i1:i2]]
            else:
                out += ["-" + l for l in old[i1:i2]]
                out += ["+" + l for l in new[j1:j2]]
    out.append("*** End Patch")
    return "\n".join(out) + "\n"


def lazy(path, gs, new):
    marker = f"{comment(path)} ... existing code ..."
    out = []
    last = 0
    for g in gs:
        j1, j2 = g[0][3], g[-1][4]
        if j1 > last:
            out.append(marker)
        out += new[j1:j2]
        last = j2
    if last < len(new):
        out.append(marker)
    return "\n".join(out) + "\n"


def split(text):
    """Lines without endings, and whether the file is expressible line by line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("package")
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--caret", default="target/release/caret")
    ap.add_argument("--work", default="/tmp/caret-apply-eval")
    ap.add_argument("--json")
    ap.add_argument("--failures", help="write each failing case (old, edit, expected, got) under this folder")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    old_root, new_root = fetch(args.package, args.old, work), fetch(args.package, args.new, work)

    pairs, skipped = [], 0
    for new_path in sorted(new_root.rglob("*")):
        rel = new_path.relative_to(new_root)
        old_path = old_root / rel
        if not new_path.is_file() or not old_path.is_file() or new_path.suffix not in TEXT_SUFFIXES:
            continue
        try:
            old_text, new_text = old_path.read_text("utf-8"), new_path.read_text("utf-8")
        except UnicodeDecodeError:
            continue
        if old_text == new_text:
            continue
        # Line-based formats cannot say "the line endings or the final newline changed".
        if ("\r" in old_text) != ("\r" in new_text) or old_text.endswith("\n") != new_text.endswith("\n"):
            skipped += 1
            continue
        pairs.append((rel, old_path, new_path, old_text, new_text))

    formats = ["udiff", "search-replace", "patch", "lazy"]
    results = {f: {"exact": 0, "total": 0, "failures": []} for f in formats}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for rel, old_path, new_path, old_text, new_text in pairs:
            old, new = split(old_text.replace("\r\n", "\n")), split(new_text.replace("\r\n", "\n"))
            gs = groups(old, new)
            unique = unique_groups(old, new)
            edits = {
                "udiff": udiff(rel, old, new),
                "search-replace": search_replace(unique, old, new),
                "patch": patch(str(rel), unique, old, new),
                "lazy": lazy(new_path, gs, new),
            }
            for fmt, edit in edits.items():
                ws = tmp / fmt
                target = ws / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(old_path.read_bytes())
                edit_file = tmp / f"{fmt}.edit"
                edit_file.write_text(edit)
                where = str(ws) if fmt == "patch" else str(target)
                r = subprocess.run([args.caret, "apply", where, "--edit", str(edit_file), "--format", fmt],
                                   capture_output=True, text=True)
                ok = r.returncode == 0 and target.read_bytes() == new_path.read_bytes()
                res = results[fmt]
                res["total"] += 1
                res["exact"] += ok
                if not ok and args.failures:
                    case = Path(args.failures) / fmt / str(rel).replace("/", "__")
                    case.mkdir(parents=True, exist_ok=True)
                    (case / "old").write_bytes(old_path.read_bytes())
                    (case / "edit").write_text(edit)
                    (case / "expected").write_bytes(new_path.read_bytes())
                    (case / "got").write_bytes(target.read_bytes())
                    (case / "stderr").write_text(r.stderr)
                if not ok and len(res["failures"]) < 5:
                    why = r.stderr.strip().splitlines()[-1] if r.returncode else "applied, but not byte for byte"
                    res["failures"].append(f"{rel}: {why[:200]}")

    print(f"{args.package} {args.old} -> {args.new}: {len(pairs)} changed text files "
          f"({skipped} skipped: line endings or final newline changed)")
    for fmt in formats:
        r = results[fmt]
        rate = 100.0 * r["exact"] / r["total"] if r["total"] else float("nan")
        print(f"  {fmt:<15} {r['exact']:>4} / {r['total']:<4} exact ({rate:.1f}%)")
        for f in r["failures"]:
            print(f"      {f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"package": args.package, "old": args.old, "new": args.new,
                                               "files": len(pairs), "skipped": skipped, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
