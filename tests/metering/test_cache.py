"""The cache advisor end to end: multi-round conversations through a real chatgate (openai and anthropic
SDKs) to a fake DeepSeek with a context cache like DeepSeek's (chatgate.demo.prefix_cache), on SQLite and
PostgreSQL. A stable agent loop has a high hit rate and no break; a clock at the top of the system prompt,
tools reordered each round, and a user_id per round each break the prefix where they are, with money lost;
every report's hit rate equals the fake's usage; no prompt text reaches a report, a metric or a log line."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from chatgate.demo.deepseek import FakeState
from chatgate.gateway.accesslog import AccessLog
from chatgate.gateway.auth import fingerprint
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate
from tests.metering.helpers import cli
from tests.pgutil import fresh_database

MARKER = "ZEBRA-QUOKKA-7731"  # in every prompt: must never come out of chatgate
ROUNDS = 4
POLICY = " ".join(f"Rule {i}: {MARKER} releases follow the checklist item {i} before they ship."
                  for i in range(40))
TOOLS = [
    {"type": "function", "function": {
        "name": name, "description": f"{desc} {MARKER}",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
    for name, desc in (("read_file", "Read a file of the repository."), ("run_tests", "Run the test suite."),
                       ("grep", "Search the repository."), ("git_log", "Show recent commits."),
                       ("deploy", "Deploy a build to staging."))
]
NO_THINKING = {"thinking": {"type": "disabled"}}

# scenario -> (its client key, the break param expected on every round after the first, or None)
SCENARIOS = {
    "stable": ("sk-cache-stable", None),
    "clock": ("sk-cache-clock", "messages[0].content"),
    "clock-streamed": ("sk-cache-clock-streamed", "messages[0].content"),
    "tools": ("sk-cache-tools", "tools"),
    "user": ("sk-cache-user", "user_id"),
    "anthropic": ("sk-cache-anthropic", "system"),
    "responses": ("sk-cache-responses", "instructions"),
    "anthropic-stable": ("sk-cache-anthropic-stable", None),
    "responses-stable": ("sk-cache-responses-stable", None),
}


def system_prompt(r: int, clock: bool) -> str:
    head = f"Current time: 2026-12-02T19:{r:02d}:00Z. " if clock else ""
    return f"{head}You are the release assistant of the platform team. {POLICY}"


def streamed(client: openai.OpenAI, **kwargs: Any) -> tuple[str | None, dict[str, Any] | None]:
    """(content, the tool call) of a streamed chat completion, from its deltas."""
    content, call = "", {"id": "", "name": "", "arguments": ""}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        content += delta.content or ""
        for fragment in delta.tool_calls or ():
            call["id"] += fragment.id or ""
            if fragment.function is not None:
                call["name"] += fragment.function.name or ""
                call["arguments"] += fragment.function.arguments or ""
    return content, (call if call["id"] else None)


def agent_loop(client: openai.OpenAI, *, clock: bool = False, rotate: bool = False,
               per_round_user: bool = False, stream: bool = False) -> None:
    """ROUNDS rounds of an agent: a user turn, a tool call, its result, an answer; the whole history is sent
    each time."""
    history: list[dict[str, Any]] = []
    for r in range(ROUNDS):
        tools = TOOLS[r % len(TOOLS):] + TOOLS[:r % len(TOOLS)] if rotate else TOOLS
        extra: dict[str, Any] = {**NO_THINKING, **({"user_id": f"user-{r}"} if per_round_user else
                                                   {"user_id": "user-stable"})}
        history.append({"role": "user", "content": f"Round {r}: {MARKER} check build {r} and report."})
        for _ in range(2):
            messages = [{"role": "system", "content": system_prompt(r, clock)}, *history]
            kwargs: dict[str, Any] = {"model": "deepseek-flash", "messages": messages, "tools": tools,
                                      "extra_body": extra}
            if stream:
                content, call = streamed(client, **kwargs)
            else:
                msg = client.chat.completions.create(**kwargs).choices[0].message
                content = msg.content
                call = None if not msg.tool_calls else {
                    "id": msg.tool_calls[0].id, "name": msg.tool_calls[0].function.name,
                    "arguments": msg.tool_calls[0].function.arguments}
            if call is None:
                history.append({"role": "assistant", "content": content})
                break
            history.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call["id"], "type": "function",
                 "function": {"name": call["name"], "arguments": call["arguments"]}}]})
            history.append({"role": "tool", "tool_call_id": call["id"], "content": f"{MARKER} ok: 12 passed"})


def anthropic_loop(client: anthropic.Anthropic, clock: bool = True) -> None:
    messages: list[dict[str, Any]] = []
    for r in range(ROUNDS):
        messages.append({"role": "user", "content": f"Round {r}: {MARKER} summarise build {r}."})
        resp = client.messages.create(model="deepseek-flash", max_tokens=200, system=system_prompt(r, clock),
                                      messages=messages)  # type: ignore[arg-type]
        text = "".join(b.text for b in resp.content if b.type == "text")
        messages.append({"role": "assistant", "content": text})


def responses_loop(client: openai.OpenAI, clock: bool = True) -> None:
    items: list[dict[str, Any]] = []
    for r in range(ROUNDS):
        items.append({"role": "user", "content": f"Round {r}: {MARKER} summarise build {r}."})
        resp = client.responses.create(model="deepseek-flash", instructions=system_prompt(r, clock),
                                       input=items)  # type: ignore[arg-type]
        items.append({"role": "assistant", "content": resp.output_text})


@dataclass
class Run:
    gate: RunningChatgate
    fake: RunningFake
    store_url: str
    tmp: Path
    logged: list[str]
    cache_cache: dict[str, Any] = field(default_factory=dict)

    def admin(self, path: str) -> httpx2.Response:
        return httpx2.get(self.gate.url + path, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)

    def cache_report(self, by: str = "key") -> dict[str, Any]:
        if by not in self.cache_cache:
            resp = self.admin(f"/admin/cache?by={by}")
            assert resp.status_code == 200, resp.text
            self.cache_cache[by] = resp.json()
        report: dict[str, Any] = self.cache_cache[by]
        return report

    def row(self, scenario: str) -> dict[str, Any]:
        key_id = fingerprint(SCENARIOS[scenario][0])
        rows = [r for r in self.cache_report()["rows"] if r["key_id"] == key_id]
        assert len(rows) == 1, self.cache_report()
        return rows[0]


def _wait_stored(gate: RunningChatgate, count: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        recorder = gate.state.recorder
        if recorder is not None and recorder.written >= count and recorder.pending == 0:
            return
        time.sleep(0.02)
    raise AssertionError("usage records not stored in time")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp(f"cache-{request.param}")
    handler = _Lines()  # chatgate's own log lines (its loggers are all under "chatgate")
    root = logging.getLogger("chatgate")
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    access = tmp / "access.log"
    with _store_url(request.param, tmp) as url, run_fake_deepseek(FakeState(prefix_cache=True)) as fake:
        settings = make_settings(tmp, fake.url, auth={"admin_key": ADMIN_KEY}, store={"url": url},
                                 server={"access_log": True})
        with run_chatgate(settings) as gate:
            gate.state.gw.ledger.access_log = AccessLog(os.open(access, os.O_WRONLY | os.O_CREAT, 0o600))
            for scenario, (key, _) in SCENARIOS.items():
                base = gate.url + "/v1"
                if scenario.startswith("anthropic"):
                    anthropic_loop(anthropic.Anthropic(base_url=gate.url + "/anthropic", api_key=key),
                                   clock=not scenario.endswith("stable"))
                elif scenario.startswith("responses"):
                    responses_loop(openai.OpenAI(base_url=base, api_key=key),
                                   clock=not scenario.endswith("stable"))
                else:
                    agent_loop(openai.OpenAI(base_url=base, api_key=key), clock=scenario.startswith("clock"),
                               rotate=scenario == "tools", per_round_user=scenario == "user",
                               stream=scenario.endswith("streamed"))
            _wait_stored(gate, len(fake.state.requests))
            gate.state.gw.ledger.access_log.flush()
            result = Run(gate, fake, url, tmp, handler.lines)
            for by in ("key", "team", "model"):
                result.cache_report(by)
            result.logged.append(access.read_text())
            yield result
    root.removeHandler(handler)
    root.setLevel(old_level)


class _store_url:
    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind, self.tmp, self._pg = kind, tmp, None

    def __enter__(self) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{self.tmp}/usage.db"
        self._pg = fresh_database()
        return self._pg.__enter__()  # type: ignore[attr-defined]

    def __exit__(self, *exc: Any) -> None:
        if self._pg is not None:
            self._pg.__exit__(*exc)  # type: ignore[attr-defined]


def issued(run: Run, scenario: str) -> dict[str, int]:
    totals: dict[str, int] = run.fake.state.issued_report()["per_key"][SCENARIOS[scenario][0]]
    return totals


# --- hit rates ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_cache_report_has_the_fakes_hits(run: Run, scenario: str) -> None:
    fake, row = issued(run, scenario), run.row(scenario)
    assert row["prompt_tokens"] == fake["prompt_tokens"] > 0
    assert row["cache_hit_tokens"] == fake["prompt_cache_hit_tokens"]
    assert row["hit_rate"] == round(fake["prompt_cache_hit_tokens"] / fake["prompt_tokens"], 6)
    assert row["requests"] == fake["requests"]
    assert (row["saved_usd"] > 0) == (fake["prompt_cache_hit_tokens"] > 0)


def test_the_usage_report_has_hit_rates_and_savings(run: Run) -> None:
    resp = run.admin("/admin/usage?by=key")
    assert resp.status_code == 200, resp.text
    rows = {r["key_id"]: r for r in resp.json()["rows"]}
    for scenario, (key, _) in SCENARIOS.items():
        fake, row = issued(run, scenario), rows[fingerprint(key)]
        assert row["prompt_cache_hit_tokens"] == fake["prompt_cache_hit_tokens"]
        assert row["cache_hit_rate"] == round(fake["prompt_cache_hit_tokens"] / fake["prompt_tokens"], 6)
        assert row["cache_saved_usd"] == run.row(scenario)["saved_usd"]
    days = run.admin("/admin/usage?by=day").json()
    total_hits = sum(issued(run, s)["prompt_cache_hit_tokens"] for s in SCENARIOS)
    assert days["totals"]["prompt_cache_hit_tokens"] == total_hits
    assert days["rows"][0]["cache_hit_rate"] is not None


@pytest.mark.slow  # the CLI as processes
def test_the_cli_reports_match_the_http_ones(run: Run) -> None:
    out = cli("cache", "--by", "key", "--format", "json", "--store", run.store_url)
    assert json.loads(out.stdout)["rows"] == run.cache_report()["rows"]
    table = cli("cache", "--by", "team", "--store", run.store_url).stdout
    assert "hit_rate" in table and "break at messages[0].content" in table
    assert "hint: a value that changes every request" in table
    usage = cli("usage", "--by", "model", "--store", run.store_url).stdout
    assert "hit%" in usage and "saved_usd" in usage
    assert MARKER not in table + usage + out.stdout


# --- breaks ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["stable", "anthropic-stable", "responses-stable"])
def test_a_stable_conversation_has_a_high_hit_rate_and_no_break(run: Run, scenario: str) -> None:
    row = run.row(scenario)
    assert row["breaks"] == [] and row["lost_usd"] == 0
    assert row["hit_rate"] > 0.5


@pytest.mark.parametrize("scenario", [s for s, (_, param) in SCENARIOS.items() if param is not None])
def test_a_changing_part_breaks_the_prefix_every_round_after_the_first(run: Run, scenario: str) -> None:
    row = run.row(scenario)
    expected = SCENARIOS[scenario][1]
    assert [b["param"] for b in row["breaks"]] == [expected], row["breaks"]
    found = row["breaks"][0]
    assert found["count"] == ROUNDS - 1
    assert found["lost_tokens"] >= 64 * (ROUNDS - 1) and found["lost_usd"] > 0
    assert row["lost_usd"] == found["lost_usd"] and row["lost_estimated"] is True
    assert found["hint"] and found["example_request_id"]
    # what the break cost: the stable loop's hit rate is far above this one's
    assert row["hit_rate"] < run.row("stable")["hit_rate"]


@pytest.mark.parametrize("scenario", ["clock", "clock-streamed", "tools", "user"])
def test_the_estimated_loss_is_close_to_what_the_break_really_cost(run: Run, scenario: str) -> None:
    """The same loop without the changing part (the stable one) hit this many more tokens: the estimate
    (docs/cache.md) is within 10% of it."""
    really = run.row("stable")["cache_hit_tokens"] - run.row(scenario)["cache_hit_tokens"]
    estimated = run.row(scenario)["breaks"][0]["lost_tokens"]
    assert really > 0 and abs(estimated - really) <= 0.1 * really, (estimated, really)


def test_breaks_are_sorted_by_money_and_grouped_by_team_and_model(run: Run) -> None:
    team = run.cache_report("team")["rows"]
    assert [r["team"] for r in team] == ["default"]
    params = [b["param"] for b in team[0]["breaks"]]
    assert set(params) == {p for _, p in SCENARIOS.values() if p is not None}
    lost = [b["lost_picousd"] for b in team[0]["breaks"]]
    assert lost == sorted(lost, reverse=True)
    model = run.cache_report("model")["rows"]
    assert sum(r["prompt_tokens"] for r in model) == sum(issued(run, s)["prompt_tokens"] for s in SCENARIOS)


# --- metrics, logs, no text ------------------------------------------------------------------------------


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_count_hits_savings_and_breaks(run: Run) -> None:
    text = httpx2.get(run.gate.url + "/metrics", timeout=10).text
    hits = sum(issued(run, s)["prompt_cache_hit_tokens"] for s in SCENARIOS)
    assert _metric(text, "chatgate_tokens_total", kind="cache_hit", team="default") == hits
    assert _metric(text, "chatgate_cache_breaks_total", param="messages[0].content") == 2 * (ROUNDS - 1)
    assert _metric(text, "chatgate_cache_breaks_total", param="tools") == ROUNDS - 1
    saved = sum(r["saved_usd"] for r in run.cache_report()["rows"])
    assert _metric(text, "chatgate_cache_saved_usd_total") == pytest.approx(saved, rel=1e-6)
    assert _metric(text, "chatgate_cache_lost_usd_total") > 0


def test_no_prompt_text_in_any_report_metric_or_log(run: Run) -> None:
    outputs = [json.dumps(run.cache_report(by)) for by in ("key", "team", "model")]
    outputs += [run.admin(f"/admin/usage?by={by}").text for by in ("key", "team", "model", "day")]
    outputs.append(httpx2.get(run.gate.url + "/metrics", timeout=10).text)
    outputs.append(run.admin("/admin/usage/timeseries?by=team").text)
    outputs += run.logged
    for text in outputs:
        assert MARKER not in text
        assert "release assistant" not in text
    access = run.logged[-1]
    # the log says where, not what
    assert access.count('"cache_break":"messages[0].content"') == 2 * (ROUNDS - 1)




# --- the dashboard ----------------------------------------------------------------------------------------


def test_the_timeseries_has_each_teams_hit_rate(run: Run) -> None:
    series = run.admin("/admin/usage/timeseries?by=team&bucket=day").json()["series"]
    [team] = series
    hits = sum(issued(run, s)["prompt_cache_hit_tokens"] for s in SCENARIOS)
    prompt = sum(issued(run, s)["prompt_tokens"] for s in SCENARIOS)
    assert team["hit_rate"][-1] == round(hits / prompt, 6) and team["hit_rate"][:-1] == [None] * 13
    assert sum(team["cache_hit_tokens"]) == hits and sum(team["prompt_tokens"]) == prompt


@pytest.mark.slow  # Chromium
def test_the_dashboards_cache_card_draws_hit_rates_and_the_costliest_breaks(run: Run, tmp_path: Path) -> None:
    from tests.web.test_dashboard import chart_attrs, chromium

    dom = chromium(tmp_path, "--dump-dom", f"{run.gate.url}/admin/dashboard#key={ADMIN_KEY}").stdout
    assert 'data-state="ready"' in dom, dom[:3000]
    chart = chart_attrs(dom, "chart-cache-team")
    assert chart["data-series"] == "1"
    [[label, rates]] = json.loads(chart["data-rates"].replace("&quot;", '"'))
    assert label == "default" and rates[-1] == run.cache_report("team")["totals"]["hit_rate"]
    rows = re.findall(r'<tr class="break-row"[^>]*>', dom)
    params = [dict(re.findall(r'([\w-]+)="([^"]*)"', r))["data-param"] for r in rows]
    expected = [b["param"] for b in run.cache_report("team")["rows"][0]["breaks"]]
    assert params == expected and len(params) == 5
    assert "move it to the last user message" in dom and MARKER not in dom


def test_the_cache_report_is_in_the_pricing_currency(tmp_path: Path) -> None:
    """A CNY deployment's report sums the yuan records' savings and losses (saved_cny, lost_picocny), never
    the USD ones (a store written before in USD)."""
    from chatgate.metering.cache_report import build_cache_report, render_cache_table
    from chatgate.store.base import UsageRecord
    from chatgate.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "usage.db")
    try:
        store.migrate()
        base = {"request_id": "r", "key_id": "k1", "key_name": "alpha", "team": "red",
                "model": "deepseek-flash", "route": "/v1/chat/completions", "stream": False, "outcome": "ok",
                "prompt_tokens": 640, "prompt_cache_hit_tokens": 512}
        store.insert_usage([
            UsageRecord(record_id="u", ts=1.0, **base, cache_saved_picousd=7, cache_break="tools",
                        cache_lost_tokens=64, cache_lost_picousd=3),
            UsageRecord(record_id="c", ts=2.0, **base, cache_saved_picousd=50, cache_break="tools",
                        cache_lost_tokens=64, cache_lost_picousd=20, currency="CNY")])
        usd, cny = (build_cache_report(store, "team", None, None, c) for c in ("USD", "CNY"))
    finally:
        store.close()
    assert (usd["rows"][0]["saved_picousd"], usd["rows"][0]["lost_picousd"]) == (7, 3)
    assert cny["currency"] == "CNY" and "saved_usd" not in cny["rows"][0]
    (row,) = cny["rows"]
    assert (row["saved_picocny"], row["lost_picocny"], row["breaks"][0]["lost_picocny"]) == (50, 20, 20)
    assert (cny["totals"]["saved_picocny"], usd["totals"]["saved_picousd"]) == (50, 7)
    table = render_cache_table(cny)
    assert "saved_cny" in table.splitlines()[0] and "~¥0 lost (e.g." in table
