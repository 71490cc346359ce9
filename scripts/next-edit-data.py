#!/usr/bin/env python3
"""Builds next edit's training and evaluation cases from real history, and trains the ranker.

Sources, by language (a fixed list, chosen once by `choose` and kept in
scripts/next-edit-packages.tsv):
- Python: the two newest releases with a source archive of PyPI packages ranked 201-1500 by
  downloads (the machine's PyPI package list); the 200 most downloaded are left out.
- TypeScript: the two newest releases of npm packages ranked 201-6000 by monthly downloads
  that ship `.ts` sources (the 200 most downloaded left out).
- Rust: crates.io's newest two releases of command-line programs (no download ranks can be
  read from here; programs are never among the most downloaded crates, which are libraries
  that others depend on), and this repository's own history up to a fixed commit.
- Go: Debian's Go source packages (`golang-*-dev`) whose versions in two releases differ.

Each case: a file's text around the first of two small hunks (at most 3 lines a side, the
second within 60 lines after the first), the first hunk (applied as the user's edit) and the
second (what comes next). Packages (commits, for this repository) are split once by a hash of
their name: three in ten evaluate, the rest train.

    scripts/next-edit-data.py choose            # writes scripts/next-edit-packages.tsv
    scripts/next-edit-data.py build [--prune]   # downloads, writes the cases (--prune: and
                                                # keeps in the list only packages that gave some)
    scripts/next-edit-data.py train             # runs the trainer over the training cases

`build` writes the evaluation cases to crates/caret-bench/src/data/next-edit/<language>.jsonl
and the training cases to $CARET_NEXT_EDIT_DATA (default ~/.cache/caret/next-edit). `train`
writes crates/caret-next-edit/src/weights.txt.
"""

import argparse
import concurrent.futures
import difflib
import hashlib
import io
import json
import lzma
import os
import random
import re
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = os.path.join(ROOT, "scripts", "next-edit-packages.tsv")
EVAL_DIR = os.path.join(ROOT, "crates", "caret-bench", "src", "data", "next-edit")
DATA = os.environ.get("CARET_NEXT_EDIT_DATA", os.path.expanduser("~/.cache/caret/next-edit"))
LISTS = "/usr/share/package-lists"
SEED = 52
# This repository's history up to this commit (a fixed set, whatever is committed later).
REPOSITORY_UNTIL = "5b5e15e677f216ada70a7640a469a45a6129ac63"

MAX_SIDE = 3
MAX_APART = 60
BEFORE, AFTER = 80, 140
PER_FILE, PER_PACKAGE = 2, 8
EVAL_CASES = 200
# Cases with another file open kept for evaluation, a language (each holds two files' text).
OPEN_EVAL_CASES = 100
MAX_FILE = 400_000
EXTENSIONS = {"python": (".py",), "typescript": (".ts",), "rust": (".rs",), "go": (".go",)}
# Debian's mirror and the registries' download addresses, as their clients use them.
PYPI = "https://pypi.org/pypi/{}/json"
NPM = "https://registry.npmjs.org/{}"
CRATE_INDEX = "https://index.crates.io/{}"
CRATE_FILE = "https://static.crates.io/crates/{0}/{0}-{1}.crate"
DEBIAN = "http://deb.debian.org/debian/"
DEBIAN_SUITES = ("bookworm", "trixie")

RUST_PROGRAMS = """bat fd-find ripgrep tokei hyperfine just git-delta du-dust bottom broot sd procs xsv
tealdeer grex miniserve mdbook cargo-edit cargo-watch cargo-outdated cargo-audit cargo-deny
cargo-expand watchexec-cli difftastic typos-cli taplo-cli stylua selene jless gitui zellij lsd
eza dua-cli oha xh choose hexyl pastel navi atuin topgrade onefetch rust-script sccache
cargo-make trunk wasm-pack mdcat skim zoxide starship nushell felix yazi-fm bacon cargo-binstall
cargo-udeps cargo-llvm-cov cargo-generate cargo-release git-cliff jaq fclones kondo ouch
czkawka_cli diskonaut gping bandwhich trippy dog rnr sic lychee cargo-update cargo-sweep
cargo-tarpaulin cargo-fuzz cargo-insta flamegraph inferno cargo-bloat cargo-criterion
cargo-msrv cargo-semver-checks cargo-hack cargo-machete cargo-dist cargo-about cargo-license
cargo-modules cargo-show-asm cargo-readme cargo-all-features cargo-sort cargo-workspaces
cargo-chef cargo-zigbuild cargo-lambda cargo-leptos dioxus-cli tauri-cli sqlx-cli diesel_cli
sea-orm-cli refinery_cli mdbook-linkcheck mdbook-mermaid zola cobalt-bin vivid pueue bore-cli
rustscan feroxbuster ripgrep_all fselect runiq xcp dysk erdtree tre-command lfs rargs
pipe-rename frawk qsv tidy-viewer csvlens htmlq dprint shellharden texlab taplo-lsp
evcxr_repl irust bunyan wasm-bindgen-cli wasm-tools wasmtime-cli twiggy espup probe-rs-tools
cargo-espflash elf2uf2-rs svd2rust form cross committed convco cocogitto git-absorb
git-interactive-rebase-tool gitoxide jj-cli sapling-streampager spotify_player ncspot
termusic kmon systeroid rtop zenith ytop macchina fastfetch-rs bottom-up tickrs
""".split()


def fetch(url, accept=None):
    req = urllib.request.Request(url, headers={"User-Agent": "caret-next-edit-data", **({"Accept": accept} if accept else {})})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()


def cached(url, name):
    path = os.path.join(DATA, "archives", name)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        body = fetch(url)
        with open(path + ".part", "wb") as f:
            f.write(body)
        os.replace(path + ".part", path)
    with open(path, "rb") as f:
        return f.read()


def is_eval(name):
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % 10 < 3


def plain(v):
    return re.fullmatch(r"\d+(\.\d+){1,3}", v) is not None


def vkey(v):
    return tuple(int(x) for x in v.split("."))


# --- choose ------------------------------------------------------------------------------


def pypi_pair(name):
    meta = json.loads(fetch(PYPI.format(name)))
    rel = []
    for v, files in meta.get("releases", {}).items():
        sd = [f for f in files if f.get("packagetype") == "sdist" and f["filename"].endswith((".tar.gz", ".zip"))]
        if plain(v) and sd:
            # A mirror answers with addresses relative to the page.
            rel.append((vkey(v), v, urllib.parse.urljoin(PYPI.format(name), sd[0]["url"])))
    rel.sort()
    return [("python", "pypi", name, rel[-2][1], rel[-2][2], rel[-1][1], rel[-1][2])] if len(rel) >= 2 else []


def npm_pair(name):
    meta = json.loads(fetch(NPM.format(name.replace("/", "%2F")), "application/vnd.npm.install-v1+json"))
    rel = sorted((vkey(v), v, d["dist"]["tarball"]) for v, d in meta.get("versions", {}).items() if plain(v))
    return [("typescript", "npm", name, rel[-2][1], rel[-2][2], rel[-1][1], rel[-1][2])] if len(rel) >= 2 else []


def crate_pair(name):
    n = name.lower()
    prefix = {1: "1/", 2: "2/", 3: f"3/{n[0]}/"}.get(len(n), f"{n[:2]}/{n[2:4]}/")
    rel = []
    for line in fetch(CRATE_INDEX.format(prefix + n)).decode().splitlines():
        d = json.loads(line)
        if plain(d["vers"]) and not d.get("yanked"):
            rel.append((vkey(d["vers"]), d["vers"]))
    rel.sort()
    if len(rel) < 2:
        return []
    (_, a), (_, b) = rel[-2], rel[-1]
    return [("rust", "crates", name, a, CRATE_FILE.format(name, a), b, CRATE_FILE.format(name, b))]


def debian_go():
    found = {}
    for suite in DEBIAN_SUITES:
        text = lzma.decompress(fetch(f"{DEBIAN}dists/{suite}/main/binary-all/Packages.xz")).decode()
        for block in text.split("\n\n"):
            m = dict(re.findall(r"^(Package|Version|Filename): (.*)$", block, re.M))
            p = m.get("Package", "")
            if p.startswith("golang-") and p.endswith("-dev"):
                found.setdefault(p, {})[suite] = (m["Version"], DEBIAN + m["Filename"])
    rows = []
    for p, s in sorted(found.items()):
        if len(s) == 2 and s[DEBIAN_SUITES[0]][0] != s[DEBIAN_SUITES[1]][0]:
            (a, ua), (b, ub) = s[DEBIAN_SUITES[0]], s[DEBIAN_SUITES[1]]
            rows.append(("go", "debian", p, a, ua, b, ub))
    return rows


def choose(args):
    rng = random.Random(SEED)
    pypi = []
    for line in open(os.path.join(LISTS, "pypi.tsv"), encoding="utf-8"):
        f = line.rstrip("\n").split("\t")
        if len(f) > 3 and f[3].isdigit() and 200 < int(f[3]) <= 1500:
            pypi.append(f[0])
    npm = []
    for line in open(os.path.join(LISTS, "npm.tsv"), encoding="utf-8"):
        f = line.rstrip("\n").split("\t")
        if len(f) > 2 and f[2].isdigit():
            npm.append((-int(f[2]), f[0]))
    npm = [n for _, n in sorted(npm)[200:6000]]
    rng.shuffle(pypi)
    rng.shuffle(npm)
    jobs = [(pypi_pair, n) for n in pypi[: args.python]] + [(npm_pair, n) for n in npm[: args.npm]]
    jobs += [(crate_pair, n) for n in RUST_PROGRAMS]
    rows = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for r in pool.map(lambda j: safe(j[0], j[1]), jobs):
            rows += r
    go = debian_go()
    rng.shuffle(go)
    rows += go[: args.go]
    with open(PACKAGES, "w") as f:
        f.write("# language\tregistry\tname\told\told_url\tnew\tnew_url (scripts/next-edit-data.py choose)\n")
        for r in sorted(rows):
            f.write("\t".join(r) + "\n")
    print(f"{len(rows)} packages", file=sys.stderr)


def safe(f, *a):
    try:
        return f(*a)
    except Exception as e:  # a package that fails is left out, and said
        print(f"skipped {a}: {e}", file=sys.stderr)
        return []


# --- build -------------------------------------------------------------------------------


def sources(blob, url, language):
    """path (without the archive's top folder) -> text, for the language's files."""
    ext = EXTENSIONS[language]
    out = {}

    def keep(path, data):
        if path.endswith(ext) and not path.endswith(".d.ts") and len(data) <= MAX_FILE and "node_modules/" not in path:
            try:
                out[path.split("/", 1)[-1]] = data.decode("utf-8")
            except UnicodeDecodeError:
                pass

    if url.endswith(".zip"):
        z = zipfile.ZipFile(io.BytesIO(blob))
        for n in z.namelist():
            keep(n, z.read(n))
        return out
    if url.endswith(".deb"):
        blob = deb_data(blob)
    with tarfile.open(fileobj=io.BytesIO(blob)) as t:
        for m in t:
            if m.isfile() and m.size <= MAX_FILE:
                keep(m.name.lstrip("./"), t.extractfile(m).read())
    return out


def deb_data(blob):
    """The data tarball of a Debian package (an `ar` archive)."""
    at = 8
    while at < len(blob):
        name = blob[at : at + 16].decode().strip()
        size = int(blob[at + 48 : at + 58].decode().strip())
        body = blob[at + 60 : at + 60 + size]
        if name.startswith("data.tar"):
            return body
        at += 60 + size + (size % 2)
    raise ValueError("no data.tar in the package")


def hunks(old, new):
    """(old start line, old lines, new lines) of each change between two texts' lines."""
    out = []
    sm = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag != "equal":
            out.append((i1 + 1, old[i1:i2], new[j1:j2]))
    return out


def cases_of(source, path, before, after):
    old, new = before.split("\n"), after.split("\n")
    if len(old) > 6000 or len(new) > 6000:
        return []
    small = [h for h in hunks(old, new) if len(h[1]) <= MAX_SIDE and len(h[2]) <= MAX_SIDE]
    out = []
    for first, second in zip(small, small[1:]):
        if not (0 < second[0] - first[0] <= MAX_APART) or second[0] < first[0] + len(first[1]):
            continue
        lo = max(1, first[0] - BEFORE)
        hi = min(len(old), first[0] + AFTER)
        if second[0] + len(second[1]) > hi:
            continue
        out.append(
            {
                "source": source,
                "path": path,
                "text": "\n".join(old[lo - 1 : hi]) + "\n",
                "first": {"line": first[0] - lo + 1, "old": first[1], "new": first[2]},
                "next": {"line": second[0] - lo + 1, "old": second[1], "new": second[2]},
            }
        )
        if len(out) == PER_FILE:
            break
    return out


IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def touched(hunk):
    """The names a hunk added or removed (three characters or more)."""
    old = set(IDENT.findall("\n".join(hunk[1])))
    new = set(IDENT.findall("\n".join(hunk[2])))
    return {w for w in old ^ new if len(w) >= 3}


def excerpt_around(lines, line, count, length, rng):
    """A window of `length` lines holding lines `line`..`line + count` (1-based), placed at a
    random offset so that where the hunk sits in it says nothing; its first line."""
    if len(lines) <= length:
        return 1
    lo_min = max(1, line + count - length + 1)
    lo_max = min(line, len(lines) - length + 1)
    return rng.randint(lo_min, max(lo_min, lo_max))


def open_cases_of(source, files, rng):
    """Cases with another file open: for a small hunk in one file that adds or removes a name,
    the first other changed file (by path) with a small hunk that has that name is open
    beside it; the next edit is the file's own next small hunk within MAX_APART lines when
    there is one, else that hunk in the open file."""
    small = {}
    for path, (old, new) in files.items():
        small[path] = [h for h in hunks(old, new) if len(h[1]) <= MAX_SIDE and len(h[2]) <= MAX_SIDE]
    # Each name, to the first (path, hunk) that has it, in path order.
    first_with = {}
    for p2 in sorted(files):
        for h in small[p2]:
            for w in set(IDENT.findall("\n".join(h[1] + h[2]))):
                first_with.setdefault(w, []).append((p2, h))
    out = []
    for path in sorted(files):
        old = files[path][0]
        made = 0
        for k, first in enumerate(small[path]):
            names = touched(first)
            if not names or made == PER_FILE:
                continue
            # The first other file (by path) with a hunk that has one of the names, its first
            # such hunk.
            found = [
                next((ph for ph in first_with.get(w, []) if ph[0] != path), None) for w in sorted(names)
            ]
            found = [f for f in found if f]
            if not found:
                continue
            other = min(found, key=lambda ph: (ph[0], ph[1][0]))
            lo = max(1, first[0] - BEFORE)
            hi = min(len(old), first[0] + AFTER)
            after = small[path][k + 1] if k + 1 < len(small[path]) else None
            here = (
                after is not None
                and 0 < after[0] - first[0] <= MAX_APART
                and after[0] >= first[0] + len(first[1])
                and after[0] + len(after[1]) <= hi
            )
            p2, h2 = other
            o2 = files[p2][0]
            start = excerpt_around(o2, h2[0], len(h2[1]), BEFORE + AFTER, rng)
            text2 = "\n".join(o2[start - 1 : start - 1 + BEFORE + AFTER]) + "\n"
            nxt, next_path = (after, path) if here else (h2, p2)
            line = nxt[0] - lo + 1 if here else nxt[0] - start + 1
            out.append(
                {
                    "source": source,
                    "path": path,
                    "text": "\n".join(old[lo - 1 : hi]) + "\n",
                    "first": {"line": first[0] - lo + 1, "old": first[1], "new": first[2]},
                    "next": {"line": line, "old": nxt[1], "new": nxt[2]},
                    "next_path": next_path,
                    "others": [{"path": p2, "text": text2}],
                }
            )
            made += 1
    return out


def package_cases(row):
    language, registry, name, a, ua, b, ub = row
    ua, ub = (urllib.parse.urljoin(PYPI.format(name), u) for u in (ua, ub))
    ext = "deb" if ua.endswith(".deb") else ("zip" if ua.endswith(".zip") else "tgz")
    old = sources(cached(ua, f"{registry}/{name.replace('/', '__')}-{a}.{ext}"), ua, language)
    new = sources(cached(ub, f"{registry}/{name.replace('/', '__')}-{b}.{ext}"), ub, language)
    out = []
    changed = {}
    for path in sorted(set(old) & set(new)):
        if old[path] != new[path] and "test" not in path.split("/")[0]:
            out += cases_of(f"{registry}:{name}@{a}..{b}", path, old[path], new[path])
            o, n = old[path].split("\n"), new[path].split("\n")
            if len(o) <= 6000 and len(n) <= 6000:
                changed[path] = (o, n)
    random.Random(name).shuffle(out)
    rng = random.Random("open:" + name)
    opened = open_cases_of(f"{registry}:{name}@{a}..{b}", changed, rng)
    rng.shuffle(opened)
    return language, name, out[:PER_PACKAGE], opened[:PER_PACKAGE]


def this_repository():
    git = lambda *a: subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True, check=True).stdout
    for line in git("log", "--no-merges", "--format=%H %P", REPOSITORY_UNTIL).splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        commit, parent = parts
        out = []
        for path in git("diff", "--name-only", parent, commit, "--", "*.rs").split():
            try:
                a, b = git("show", f"{parent}:{path}"), git("show", f"{commit}:{path}")
            except subprocess.CalledProcessError:
                continue
            out += cases_of(f"caret:{commit[:12]}", path, a, b)
        yield commit, out[:PER_PACKAGE]


def build(args):
    rows = [l.rstrip("\n").split("\t") for l in open(PACKAGES) if not l.startswith("#")]
    train = {lang: [] for lang in EXTENSIONS}
    evals = {lang: [] for lang in EXTENSIONS}
    open_train = {lang: [] for lang in EXTENSIONS}
    open_evals = {lang: [] for lang in EXTENSIONS}
    useful = set()
    # Processes, not threads: the diffs are CPU work.
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        for language, name, cases, opened in pool.map(safe_cases, rows, chunksize=4):
            (evals if is_eval(name) else train)[language] += cases
            (open_evals if is_eval(name) else open_train)[language] += opened
            if cases:
                useful.add(name)
    if args.prune:
        # Packages that gave no case give none again: the list keeps those that did, so that
        # a rebuild downloads only what it uses (and writes the same cases).
        lines = [l for l in open(PACKAGES) if l.startswith("#") or l.split("\t")[2] in useful]
        with open(PACKAGES, "w") as f:
            f.writelines(lines)
    for commit, cases in this_repository():
        (evals if is_eval(commit) else train)["rust"] += cases
    os.makedirs(DATA, exist_ok=True)
    for lang in EXTENSIONS:
        random.Random(SEED).shuffle(evals[lang])
        write_cases(os.path.join(EVAL_DIR, f"{lang}.jsonl"), evals[lang][:EVAL_CASES])
        write_cases(os.path.join(DATA, f"{lang}-train.jsonl"), train[lang])
        print(f"{lang}: {len(train[lang])} training cases, {min(len(evals[lang]), EVAL_CASES)} evaluation cases", file=sys.stderr)
        random.Random(SEED).shuffle(open_evals[lang])
        write_cases(os.path.join(EVAL_DIR, f"{lang}-open.jsonl"), open_evals[lang][:OPEN_EVAL_CASES])
        write_cases(os.path.join(DATA, f"{lang}-open-train.jsonl"), open_train[lang])
        print(
            f"{lang}, another file open: {len(open_train[lang])} training cases, "
            f"{min(len(open_evals[lang]), OPEN_EVAL_CASES)} evaluation cases "
            f"({sum(c['next_path'] != c['path'] for c in open_evals[lang][:OPEN_EVAL_CASES])} next in the open file)",
            file=sys.stderr,
        )


def write_cases(path, cases):
    with open(path, "w") as f:
        for c in cases:
            f.write(json.dumps(c) + "\n")


def safe_cases(row):
    try:
        return package_cases(row)
    except Exception as e:
        print(f"skipped {row[2]}: {e}", file=sys.stderr)
        return row[0], row[2], [], []


def train(args):
    sets = [os.path.join(DATA, f"{lang}{kind}-train.jsonl") for lang in EXTENSIONS for kind in ("", "-open")]
    out = os.path.join(ROOT, "crates", "caret-next-edit", "src", "weights.txt")
    evals = [os.path.join(EVAL_DIR, f"{lang}{kind}.jsonl") for lang in EXTENSIONS for kind in ("", "-open")]
    cmd = ["cargo", "run", "--release", "-q", "-p", "caret-next-edit", "--example", "train", "--", out, *sets, "--eval", *evals]
    subprocess.run(cmd, cwd=ROOT, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("choose")
    c.add_argument("--python", type=int, default=1000)
    c.add_argument("--npm", type=int, default=5600)
    c.add_argument("--go", type=int, default=1000)
    c.add_argument("--jobs", type=int, default=8)
    b = sub.add_parser("build")
    b.add_argument("--jobs", type=int, default=8)
    b.add_argument("--prune", action="store_true", help="keep in the list only the packages that gave cases")
    sub.add_parser("train")
    args = ap.parse_args()
    {"choose": choose, "build": build, "train": train}[args.cmd](args)


if __name__ == "__main__":
    main()
