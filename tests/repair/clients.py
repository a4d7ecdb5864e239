"""A client that drops reasoning_content from the turns it sends back (as LangChain's ChatOpenAI does), for
the restore_reasoning tests: one round at a time, against any chatgate URL."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson

KEY = "sk-repair-client-0001"
SEARCH = {"type": "function", "function": {
    "name": "search_forecast", "description": "Search the weather forecast.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}


def post(url: str, body: dict[str, Any], key: str | None = KEY, path: str = "/v1/chat/completions",
         **headers: str) -> httpx2.Response:
    h = {"content-type": "application/json", **headers}
    if key:
        h["authorization"] = f"Bearer {key}"
    return httpx2.post(url + path, content=orjson.dumps(body), headers=h, timeout=20)


def tool_calls_of(response: httpx2.Response, stream: bool) -> list[dict[str, Any]]:
    """The answer's tool calls as a client puts them back into its history."""
    if not stream:
        calls = response.json()["choices"][0]["message"]["tool_calls"]
        return [{"id": c["id"], "type": "function", "function": c["function"]} for c in calls]
    merged: dict[int, dict[str, Any]] = {}
    for line in response.text.splitlines():
        if not line.startswith("data: {"):
            continue
        for part in json.loads(line[6:])["choices"][0]["delta"].get("tool_calls") or []:
            call = merged.setdefault(part["index"], {"id": "", "type": "function",
                                                     "function": {"name": "", "arguments": ""}})
            call["id"] = part.get("id") or call["id"]
            call["function"]["name"] += part.get("function", {}).get("name") or ""
            call["function"]["arguments"] += part.get("function", {}).get("arguments") or ""
    return [merged[i] for i in sorted(merged)]


@dataclass
class DroppingAgent:
    """An agent loop whose client keeps the tool calls but drops reasoning_content; the tool answers at
    once (0 ms)."""

    key: str = KEY
    messages: list[dict[str, Any]] = field(
        default_factory=lambda: [{"role": "user", "content": "Umbrella in Lisbon today?"}])
    rounds: int = 0

    def body(self, stream: bool) -> dict[str, Any]:
        return {"model": "deepseek-flash", "messages": self.messages, "tools": [SEARCH], "stream": stream}

    def round(self, url: str, stream: bool) -> httpx2.Response:
        resp = post(url, self.body(stream), key=self.key)
        if resp.status_code != 200:
            return resp
        calls = tool_calls_of(resp, stream)
        self.messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        self.messages += [{"role": "tool", "tool_call_id": c["id"], "content": f"rain, round {self.rounds}"}
                          for c in calls]
        self.messages.append({"role": "user", "content": f"and round {self.rounds + 1}?"})
        self.rounds += 1
        return resp


def dropping_loop(url: str, rounds: int, stream: bool, key: str = KEY) -> list[httpx2.Response]:
    agent = DroppingAgent(key)
    answers = []
    for _ in range(rounds):
        resp = agent.round(url, stream)
        assert resp.status_code == 200, resp.text
        answers.append(resp)
    return answers
