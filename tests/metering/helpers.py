"""Shared bits of the metering tests: realistic chat bodies, a client that sends them, the CLI, the store."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2

from tests.harness import REPO_ROOT

CHAT = "/v1/chat/completions"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def chat_body(i: int, stream: bool = False, model: str = "deepseek-flash", **extra: Any) -> dict[str, Any]:
    """A small realistic conversation; `i` varies its length so token counts differ per request."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a concise assistant for an ops team."},
        {"role": "user",
         "content": f"Summarise incident #{i} in one sentence." + " Details follow." * (i % 5)},
    ]
    body: dict[str, Any] = {"model": model, "messages": messages, **extra}
    if stream:
        body["stream"] = True
    return body


def send_chat(base_url: str, body: dict[str, Any], key: str | None = "sk-team-a",
              request_id: str | None = None, headers: dict[str, str] | None = None,
              timeout: float = 30) -> httpx2.Response:
    h = {"x-request-id": request_id} if request_id else {}
    if key is not None:
        h["authorization"] = f"Bearer {key}"
    h.update(headers or {})
    return httpx2.post(base_url + CHAT, json=body, headers=h, timeout=timeout)


def complete(base_url: str, i: int, stream: bool, key: str = "sk-team-a", rid: str | None = None,
             headers: dict[str, str] | None = None) -> str:
    """One request read to its very end; returns its request id. Fails unless the response is complete."""
    rid = rid or f"req-{i}-{'s' if stream else 'n'}"
    resp = send_chat(base_url, chat_body(i, stream), key, rid, headers)
    assert resp.status_code == 200, resp.text
    if stream:
        assert resp.text.rstrip().endswith("data: [DONE]"), resp.text[-200:]
    else:
        assert resp.json()["usage"]["completion_tokens"] > 0
    return rid


def sqlite_request_ids(db: Path) -> list[str]:
    """Every usage record's request id (duplicates kept), read with plain sqlite3."""
    conn = sqlite3.connect(db)
    try:
        return [row[0] for row in conn.execute("SELECT request_id FROM usage")]
    finally:
        conn.close()


def wait_for(predicate: Callable[[], Any], timeout: float = 20, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """`python -m chatgate ARGS…` as its own process (the real CLI), CHATGATE_* from the outer env dropped."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CHATGATE_")}
    full_env["PYTHONPATH"] = str(REPO_ROOT)
    # `usage` replays orphaned spool files: never let it pick up another process's default data/spool.
    full_env["CHATGATE_STORE_SPOOL_DIR"] = tempfile.mkdtemp(prefix="chatgate-cli-spool-")
    full_env["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="chatgate-cli-data-")  # not the user's default store
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "chatgate", *args], cwd=cwd or REPO_ROOT, env=full_env,
                          capture_output=True, text=True, timeout=60)
    if check:
        assert proc.returncode == 0, (
            f"chatgate {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def usage_json(store_url: str, by: str, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = cli("usage", "--by", by, "--format", "json", "--store", store_url, *extra, env=env)
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def create_key(store_url: str, team: str, name: str) -> tuple[str, str]:
    """(key_id, secret) from `chatgate keys create`; the secret is the last stdout line."""
    proc = cli("keys", "create", "--team", team, "--name", name, "--store", store_url)
    lines = proc.stdout.strip().splitlines()
    secret = lines[-1].strip()
    key_id = next(w for line in lines for w in line.split() if w.startswith("key_"))
    return key_id, secret
