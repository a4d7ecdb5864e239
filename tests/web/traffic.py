"""Real usage for the dashboard tests: managed keys in three teams, several models, some rejected requests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from chatgate.gateway.auth import new_key
from tests.fakes.server import run_fake_deepseek
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate

# Budgets set through the admin API once the traffic is recorded (growth and default have none): research's
# is about half used (prices are the same at every hour here, so that holds whenever the tests run),
# support's was spent many times over (a "total" budget: no period boundary can reset it while the tests
# run).
BUDGETS = {"research": {"budget_usd": "0.0006", "budget_period": "month"},
           "support": {"budget_usd": "0.000001", "budget_period": "total"}}

# (team, key name, model, ok requests, rejected requests)
PLAN = [
    ("research", "alice-laptop", "deepseek-v4-pro", 3, 0),
    ("research", "ci-evals", "deepseek-flash", 4, 1),
    ("support", "helpdesk-bot", "deepseek-flash", 2, 4),
    ("growth", "copywriter", "deepseek-v4-flash", 2, 2),
]

# Broken histories a careless client sends (rule numbers of docs/rules-chat.md).
BROKEN = [
    # A tool result with no assistant tool call before it.
    {"messages": [{"role": "user", "content": "weather?"},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]},
    # No messages at all.
    {"messages": []},
    # An assistant tool call that never gets its tool result.
    {"messages": [{"role": "user", "content": "weather in Paris?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_9", "type": "function",
                       "function": {"name": "weather", "arguments": "{}"}}]},
                  {"role": "user", "content": "and tomorrow?"}]},
]


@dataclass
class Traffic:
    gate: RunningChatgate
    keys: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # name -> (key_id, secret, team)
    ok: int = 0
    rejected: int = 0
    rejected_codes: dict[str, int] = field(default_factory=dict)
    repaired: int = 0  # requests repaired by thinking_conflict (on by default)
    limited_codes: dict[str, int] = field(default_factory=dict)  # 429s of chatgate's limits, by limit
    upstream_refused: int = 0  # DeepSeek's 4xx
    upstream_failed: int = 0  # DeepSeek's 5xx (the tests' chatgate makes no retries)
    started: float = 0.0  # every request arrived in [started, finished], all within one UTC hour
    finished: float = 0.0

    @property
    def requests(self) -> int:
        return (self.ok + self.rejected + sum(self.limited_codes.values()) + self.upstream_refused
                + self.upstream_failed)

    def admin(self, path: str, key: str | None = ADMIN_KEY) -> httpx2.Response:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx2.get(self.gate.url + path, headers=headers, timeout=10)


def clear_of_an_hour_boundary(margin: float = 20.0) -> float:
    """Wait, if need be, until the next UTC hour (and day) boundary is at least `margin` seconds away, so
    that all the traffic lands in one hour bucket; returns the time."""
    now = time.time()
    to_boundary = 3600 - now % 3600
    if to_boundary < margin:
        time.sleep(to_boundary + 0.5)
    return time.time()


@contextmanager
def dashboard_traffic(tmp_path: Path) -> Iterator[Traffic]:
    with run_fake_deepseek() as fake:
        auth = {"mode": "managed", "upstream_api_key": "sk-house", "admin_key": ADMIN_KEY}
        settings = make_settings(tmp_path, fake.url, auth=auth, pricing={"off_peak_multiplier": "1"})
        with run_chatgate(settings) as gate:
            traffic = Traffic(gate)
            for team, name, _, _, _ in PLAN:
                key_id, secret, digest, prefix = new_key()
                gate.state.store.create_key(key_id, digest, prefix, team, name)
                traffic.keys[name] = (key_id, secret, team)
            traffic.started = clear_of_an_hour_boundary()
            with httpx2.Client(base_url=gate.url, timeout=10) as client:
                for _, name, model, ok, bad in PLAN:
                    auth = {"authorization": f"Bearer {traffic.keys[name][1]}"}
                    for i in range(ok):
                        body: dict[str, Any] = {"model": model, "stream": i % 2 == 1, "messages": [
                            {"role": "user", "content": f"Summarise ticket #{i} for {name} in one line."}]}
                        if i == 1:  # thinking disabled with an effort: repaired (thinking_conflict)
                            body.update(thinking={"type": "disabled"}, reasoning_effort="high")
                        resp = client.post("/v1/chat/completions", json=body, headers=auth)
                        assert resp.status_code == 200, resp.text
                        traffic.ok += 1
                        traffic.repaired += "x-chatgate-repaired" in resp.headers
                    for i in range(bad):
                        resp = client.post("/v1/chat/completions", json={"model": model, **BROKEN[i % 3]},
                                           headers=auth)
                        assert resp.status_code == 400, resp.text
                        code = resp.json()["error"]["code"]
                        traffic.rejected_codes[code] = traffic.rejected_codes.get(code, 0) + 1
                        traffic.rejected += 1
                # DeepSeek refuses one request (its 400) and fails another (its 503)
                for name, fault in (("alice-laptop", "http_400"), ("copywriter", "http_503")):
                    resp = client.post("/v1/chat/completions", json={"model": "deepseek-flash", "messages": [
                        {"role": "user", "content": "hello"}]}, headers={
                        "authorization": f"Bearer {traffic.keys[name][1]}", "x-fake-fault": fault})
                    assert resp.status_code == int(fault[5:]), resp.text
                traffic.upstream_refused, traffic.upstream_failed = 1, 1
            wait_recorded(traffic, traffic.ok + traffic.rejected + 2)
            for team, limits in BUDGETS.items():
                resp = httpx2.put(f"{gate.url}/admin/teams/{team}", json=limits,
                                  headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
                assert resp.status_code == 200, resp.text
            # support's budget is spent: its next request is limited (429, budget:team)
            body = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "one more"}]}
            resp = httpx2.post(f"{gate.url}/v1/chat/completions", json=body, timeout=10, headers={
                "authorization": f"Bearer {traffic.keys['helpdesk-bot'][1]}"})
            assert resp.status_code == 429, resp.text
            traffic.limited_codes["budget:team"] = 1
            traffic.finished = time.time()
            assert int(traffic.started // 3600) == int(traffic.finished // 3600), "traffic crossed an hour"
            wait_recorded(traffic, traffic.requests)
            yield traffic


def wait_recorded(traffic: Traffic, requests: int, timeout: float = 10) -> dict[str, Any]:
    """The recorder writes in the background: wait until the store holds every request."""
    deadline = time.monotonic() + timeout
    while True:
        report: dict[str, Any] = traffic.admin("/admin/usage?by=team").json()
        if report["totals"]["requests"] >= requests or time.monotonic() > deadline:
            assert report["totals"]["requests"] == requests, report
            return report
        time.sleep(0.05)
