"""Trajectories (``caret rollout``'s ``trajectories.jsonl``) as a Parquet file, for trainers and
dataframes that read Parquet.

    python -m caret_env.parquet DIR [--out FILE]      # default: DIR/trajectories.parquet

One row per attempt. Scalars stay columns (``task_id``, ``attempt``, ``reward``,
``advantage``, …, token usage and timings flattened to ``usage_*`` / ``timings_*``); the
token view stays typed lists (``prompt_ids``, ``response_ids``: int32, ``response_mask``:
int8, ``response_logprobs``: float32; empty where the attempt has none); the nested parts
(``messages``, ``tools``, ``steps``, ``grader``, ``logprobs``) are JSON text, exactly as in
the JSON lines. Needs ``pyarrow`` (``pip install './python[parquet]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List

SCALARS = [
    ("task_id", "string"), ("attempt", "int32"), ("run_id", "string"), ("retries", "int32"),
    ("run_attempts", "int32"), ("reward", "float64"), ("advantage", "float64"), ("failure", "string"),
    ("state", "string"), ("reason", "string"), ("turn_end", "string"), ("temperature", "float64"),
    ("seed", "uint64"), ("patch", "string"), ("tokens_missing", "string"),
]
TOKENS = [("prompt_ids", "int32"), ("response_ids", "int32"), ("response_mask", "int8"),
          ("response_logprobs", "float32")]
NESTED = ["messages", "tools", "steps", "grader", "logprobs"]


def rows(path: str) -> List[Dict[str, Any]]:
    """The trajectories of a JSON-lines file; a line that is not JSON is an error naming it."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path} line {n}: {e}") from None
    return out


def table(trajectories: List[Dict[str, Any]]):
    """A pyarrow table of the trajectories."""
    import pyarrow as pa

    columns: Dict[str, Any] = {}
    for name, kind in SCALARS:
        columns[name] = pa.array([t.get(name) for t in trajectories], type=getattr(pa, kind)())
    for group in ("usage", "timings"):
        keys = sorted({k for t in trajectories for k, v in (t.get(group) or {}).items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)})
        for k in keys:
            columns[f"{group}_{k}"] = pa.array([(t.get(group) or {}).get(k) for t in trajectories], type=pa.float64())
    for name, kind in TOKENS:
        columns[name] = pa.array([t.get(name) or [] for t in trajectories], type=pa.list_(getattr(pa, kind)()))
    for name in NESTED:
        columns[name] = pa.array([json.dumps(t.get(name)) for t in trajectories], type=pa.string())
    return pa.table(columns)


def convert(directory: str, out: str = "") -> str:
    """Writes ``DIR/trajectories.jsonl`` as Parquet; answers the file written."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SystemExit("writing Parquet needs pyarrow: pip install pyarrow") from None
    out = out or os.path.join(directory, "trajectories.parquet")
    trajectories = rows(os.path.join(directory, "trajectories.jsonl"))
    tmp = out + ".partial"
    pq.write_table(table(trajectories), tmp, compression="zstd")
    os.replace(tmp, out)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m caret_env.parquet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="a `caret rollout` output directory")
    p.add_argument("--out", default="", help="the Parquet file (default: DIR/trajectories.parquet)")
    args = p.parse_args(argv)
    try:
        written = convert(args.dir, args.out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
