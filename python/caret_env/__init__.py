"""Client of Caret's environment API (``/v1/envs``).

An episode is one attempt at a task by an external policy, run by Caret exactly as a user's
background run: the same sandbox, tools and system prompt. ``reset`` starts one and returns
the first observation (the system prompt and the task as chat messages, and the tool
definitions); ``step`` sends the policy's assistant message (with its tool calls) and returns
what the tools answered; ``grade`` ends the agent's turn and returns the reward; ``close``
ends the episode.

Only the standard library is used, so a trainer's environment needs nothing else.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

__all__ = ["CaretEnv", "CaretError", "task_from_directory"]


class CaretError(RuntimeError):
    """An error answer of the server: its HTTP status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def task_from_directory(path: str, prompt: str, grader: str, timeout_s: Optional[int] = None,
                        git_ref: Optional[str] = None, **extra: Any) -> Dict[str, Any]:
    """A task whose code is a git repository on a disk the workers share (a ``file://`` URL)."""
    repo: Dict[str, Any] = {"kind": "git", "url": "file://" + os.path.abspath(path)}
    if git_ref:
        repo["git_ref"] = git_ref
    grade: Dict[str, Any] = {"command": grader}
    if timeout_s is not None:
        grade["timeout_s"] = timeout_s
    return {"repo": repo, "prompt": prompt, "grader": grade, **extra}


class CaretEnv:
    """One episode at a time against a Caret server (``caret serve``) with a tenant token."""

    def __init__(self, url: str, token: str, timeout_s: float = 1800.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.episode: Optional[str] = None
        self.tools: List[Dict[str, Any]] = []
        self.messages: List[Dict[str, Any]] = []

    def _call(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.token)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                text = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read().decode(errors="replace")
            try:
                message = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = raw or e.reason
            raise CaretError(e.code, message) from None
        return json.loads(text) if text else None

    def reset(self, task: Dict[str, Any]) -> Dict[str, Any]:
        """Starts an episode of ``task`` (closing this client's previous one): the first
        observation, ``{"episode", "run", "tools", "messages", "done", ...}``."""
        if self.episode is not None:
            self.close()
        obs = self._call("POST", "/v1/envs", task)
        self.episode = obs["episode"]
        self.tools = obs.get("tools", [])
        self.messages = list(obs["messages"])
        return obs

    def step(self, message: Dict[str, Any]) -> Dict[str, Any]:
        """Sends the policy's assistant message (``{"role": "assistant", "content": ...,
        "tool_calls": [...]}``); the observation holds the new messages (tool results). When
        ``done`` is true the agent's turn is over: call ``grade``."""
        obs = self._call("POST", f"/v1/envs/{self._id()}/step", {"message": message})
        self.messages.append(message)
        self.messages.extend(obs["messages"])
        return obs

    def grade(self) -> Dict[str, Any]:
        """Ends the turn, runs the task's grader: ``{"reward", "failure", "grader", "patch"}``.
        A reward of ``None`` means the environment failed, not the policy."""
        return self._call("POST", f"/v1/envs/{self._id()}/grade")

    def close(self) -> None:
        """Ends the episode (its run is stopped if it still runs)."""
        if self.episode is None:
            return
        try:
            self._call("DELETE", f"/v1/envs/{self.episode}")
        except CaretError as e:
            if e.status != 404:
                raise
        finally:
            self.episode = None

    def _id(self) -> str:
        if self.episode is None:
            raise RuntimeError("no episode: call reset first")
        return self.episode

    def __enter__(self) -> "CaretEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
