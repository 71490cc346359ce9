"""A real Ray program driving Caret's environment API: actors step episodes concurrently
against ``caret serve`` with a scripted policy (a test double standing in for a model: it
reads the file, fixes it, says so) and collect the rewards.

    python ray_episodes.py --url URL --token T --repo DIR [--episodes 16] [--actors 4] [--out FILE]

Prints one JSON object: the rewards, and the server-side step times (ms).
"""

import argparse
import json
import sys
import time

import ray

from caret_env import CaretEnv, task_from_directory

FIX = "<<<<<<< SEARCH\necho $(( $1 - $2 ))\n=======\necho $(( $1 + $2 ))\n>>>>>>> REPLACE"


def call(i, name, arguments):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


@ray.remote(max_concurrency=4)
class Stepper:
    """Runs episodes, several at once (a threaded actor)."""

    def __init__(self, url, token):
        self.url, self.token = url, token

    def episode(self, task):
        env = CaretEnv(self.url, self.token)
        timings = []
        with env:
            obs = env.reset(task)
            tools = {t["function"]["name"] for t in obs["tools"]}
            assert {"read_file", "edit_file", "run_terminal_cmd"} <= tools, tools
            assert obs["messages"][0]["role"] == "system" and obs["messages"][-1]["role"] == "user"
            # The scripted policy: read, fix, say so.
            obs = env.step({"role": "assistant", "content": None, "tool_calls": [call(1, "read_file", {"path": "add.sh"})]})
            timings.append(obs["server_ms"])
            assert obs["messages"][0]["role"] == "tool" and "$1 - $2" in obs["messages"][0]["content"], obs
            obs = env.step({"role": "assistant", "tool_calls": [call(2, "edit_file", {"path": "add.sh", "edit": FIX})]})
            timings.append(obs["server_ms"])
            assert not obs["done"] and "error" not in obs["messages"][0]["content"].lower()[:20], obs
            obs = env.step({"role": "assistant", "content": "add.sh adds now."})
            timings.append(obs["server_ms"])
            assert obs["done"], obs
            graded = env.grade()
        return {"reward": graded["reward"], "patch": graded["patch"], "server_ms": timings}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--actors", type=int, default=4)
    args = p.parse_args()
    ray.init(num_cpus=args.actors, include_dashboard=False, log_to_driver=True, logging_level="ERROR")
    started = time.time()
    task = task_from_directory(args.repo, "make add.sh add", "sh test.sh", timeout_s=60)
    actors = [Stepper.remote(args.url, args.token) for _ in range(args.actors)]
    results = ray.get([actors[i % len(actors)].episode.remote(task) for i in range(args.episodes)])
    steps = sorted(t for r in results for t in r["server_ms"])
    print(json.dumps({
        "rewards": [r["reward"] for r in results],
        "patched": sum("+echo $(( $1 + $2 ))" in r["patch"] for r in results),
        "step_server_ms_p50": steps[len(steps) // 2],
        "step_server_ms_p99": steps[min(len(steps) - 1, int(len(steps) * 0.99))],
        "seconds": round(time.time() - started, 1),
    }))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
