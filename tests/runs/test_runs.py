"""Agent runs (issue 52) on a real server against the fake DeepSeek: runs told apart without headers, by
`x-chatgate-run`, by Claude Code's session; the run bounds refuse before DeepSeek; runs survive a restart and
are shared by replicas on PostgreSQL."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatgate.cli import main
from chatgate.gateway.auth import fingerprint
from chatgate.metering import text
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import ADMIN_KEY, make_settings, run_chatgate
from tests.pgutil import fresh_database

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                            "parameters": {"type": "object",
                                                           "properties": {"path": {"type": "string"}}}}}]


@pytest.fixture
def fake() -> Any:
    with run_fake_deepseek() as running:
        yield running


def settings_for(tmp_path: Path, fake: RunningFake, **sections: dict[str, Any]) -> Any:
    auth = {"admin_key": ADMIN_KEY, **sections.pop("auth", {})}
    return make_settings(tmp_path, fake.url, auth=auth, **sections)


def chat_loop(url: str | tuple[str, ...], key: str, task: str, rounds: int,
              headers: dict[str, str] | None = None) -> list[httpx2.Response]:
    """A raw tool loop: the task, the fake's tool call, its result, the answer, "go on", ... (`rounds`); sent
    to each of several chatgates in turn when `url` names several."""
    urls = (url,) if isinstance(url, str) else url
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": task}]
    answers = []
    http = httpx2.Client(timeout=30)
    for n in range(rounds):
        resp = http.post(f"{urls[n % len(urls)]}/v1/chat/completions", json={
            "model": "deepseek-flash", "messages": messages, "tools": TOOLS},
            headers={"authorization": f"Bearer {key}", **(headers or {})})
        answers.append(resp)
        if resp.status_code != 200:
            break
        message = resp.json()["choices"][0]["message"]
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
        if message.get("tool_calls"):
            call = message["tool_calls"][0]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"file {n}: 42 lines"})
        else:
            messages.append({"role": "user", "content": f"go on ({n})"})
    return answers


def runs_of(url: str, **query: str) -> list[dict[str, Any]]:
    resp = httpx2.get(f"{url}/admin/runs", params=query, headers=ADMIN, timeout=30)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["runs"])


def test_three_loops_at_once_without_headers_are_three_runs(tmp_path: Path, fake: RunningFake) -> None:
    key = "sk-three-loops"
    with run_chatgate(settings_for(tmp_path, fake)) as gate:
        with ThreadPoolExecutor(3) as pool:
            done = list(pool.map(lambda i: chat_loop(gate.url, key, "Fix the failing test in app/x.py", 6),
                                 range(3)))
        assert all(r.status_code == 200 for answers in done for r in answers)
        runs = runs_of(gate.url)
        shown = [httpx2.get(f"{gate.url}/admin/runs/{r['run_id'][:24]}", headers=ADMIN, timeout=30)
                 for r in runs]  # an inferred run found again by (the beginning of) its id
    assert len(runs) == 3
    assert sorted(r["requests"] for r in runs) == [6, 6, 6]
    assert all(r["source"] == "inferred" and r["key_id"] == fingerprint(key) for r in runs)
    fake.state.wait_idle(10)
    issued = fake.state.issued_usage[key]
    assert sum(r["prompt_tokens"] for r in runs) == issued["prompt_tokens"]
    assert sum(r["completion_tokens"] for r in runs) == issued["completion_tokens"]
    assert sum(r["prompt_cache_hit_tokens"] for r in runs) == issued["prompt_cache_hit_tokens"]
    ids = {i for r in runs for i in r["request_ids"]}
    assert len(ids) == 18
    for r in runs:  # each run's context grows request by request
        assert r["context"] == sorted(r["context"]) and len(r["context"]) == 6
        assert r["tool_calls"] == {"read_file": 3}
    for r, resp in zip(runs, shown, strict=True):
        assert resp.status_code == 200, resp.text
        line = resp.json()["run"]
        assert (line["run_id"], line["request_ids"], line["cost_usd"]) == (r["run_id"], r["request_ids"],
                                                                          r["cost_usd"])
        assert [s["request_id"] for s in resp.json()["rounds"]] == r["request_ids"]


def test_the_same_words_with_two_run_headers_are_two_runs(tmp_path: Path, fake: RunningFake) -> None:
    with run_chatgate(settings_for(tmp_path, fake)) as gate:
        for run in ("task-a", "task-b"):
            chat_loop(gate.url, "sk-two", "Rename the module", 3, {"x-chatgate-run": run})
        runs = runs_of(gate.url)
    assert sorted((r["run_id"], r["requests"], r["source"]) for r in runs) == [
        ("task-a", 3, "header"), ("task-b", 3, "header")]


def anthropic_loop(url: str, key: str, user_id: str, rounds: int) -> list[httpx2.Response]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List the files"}]
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
    out = []
    with httpx2.Client(timeout=30) as http:
        for n in range(rounds):
            resp = http.post(f"{url}/anthropic/v1/messages", json={
                "model": "deepseek-flash", "max_tokens": 256, "messages": messages, "tools": tools,
                "metadata": {"user_id": user_id}},
                headers={"x-api-key": key, "anthropic-version": "2023-06-01"})
            out.append(resp)
            assert resp.status_code == 200, resp.text
            content = resp.json()["content"]
            messages.append({"role": "assistant", "content": content})
            uses = [b for b in content if b["type"] == "tool_use"]
            if uses:
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": u["id"], "content": f"out {n}"} for u in uses]})
            else:
                messages.append({"role": "user", "content": f"and then ({n})"})
    return out


def test_an_anthropic_loop_with_a_claude_code_session_is_one_run(tmp_path: Path, fake: RunningFake) -> None:
    session = "5f0c2a51-7d3e-4d8e-9a4b-2b1f7c9e0d13"
    user_id = json.dumps({"device_id": "ea10c3f2", "account_uuid": "", "session_id": session})
    with run_chatgate(settings_for(tmp_path, fake)) as gate:
        anthropic_loop(gate.url, "sk-claude", user_id, 4)
        runs = runs_of(gate.url)
    assert [(r["run_id"], r["source"], r["requests"]) for r in runs] == [(f"claude-{session}", "session", 4)]
    assert runs[0]["tool_calls"] == {"Bash": 2}


def test_run_max_turns_refuses_the_fourth_request_before_deepseek(tmp_path: Path, fake: RunningFake) -> None:
    key = "sk-bounded"
    with run_chatgate(settings_for(tmp_path, fake)) as gate:
        resp = httpx2.patch(f"{gate.url}/admin/keys/{fingerprint(key)}", json={"run_max_turns": 3},
                            headers=ADMIN)
        assert resp.status_code == 200, resp.text
        assert resp.json()["limits"]["run_max_turns"] == 3
        answers = chat_loop(gate.url, key, "Loop forever", 5)
        sent = [r for r in fake.state.requests if r.auth_key == key]
        runs = runs_of(gate.url)
    assert [r.status_code for r in answers] == [200, 200, 200, 429]
    refused = answers[3]
    assert refused.headers["x-should-retry"] == "false"
    error = refused.json()["error"]
    run_id = runs[0]["run_id"]
    assert error["code"] == "run_limit" and run_id in error["message"]
    assert "run_max_turns = 3" in error["message"] and "x-chatgate-run" in error["message"]
    assert len(sent) == 3  # nothing of the fourth reached the fake
    assert runs[0]["requests"] == 4 and runs[0]["refusals"] == 1
    assert runs[0]["ended"] == "stopped" and runs[0]["stopped_by"] == "run_max_turns"


def test_with_runs_off_no_request_is_in_a_run_and_no_bound_refuses(tmp_path: Path, fake: RunningFake) -> None:
    key = "sk-runs-off"
    with run_chatgate(settings_for(tmp_path, fake)) as gate:  # one run made while runs are on
        assert [r.status_code for r in chat_loop(gate.url, key, "Before", 2)] == [200, 200]
    with run_chatgate(settings_for(tmp_path, fake, runs={"enabled": False})) as gate:
        resp = httpx2.patch(f"{gate.url}/admin/keys/{fingerprint(key)}", json={"run_max_turns": 1},
                            headers=ADMIN)
        assert resp.status_code == 200, resp.text
        answers = chat_loop(gate.url, key, "Loop on, runs off", 3)
        runs = runs_of(gate.url)  # the store's runs are still served
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert len(runs) == 1 and runs[0]["requests"] == 2


def test_run_max_repeats_stops_the_same_tool_call_in_a_row(tmp_path: Path, fake: RunningFake) -> None:
    key = "sk-repeats"
    with run_chatgate(settings_for(tmp_path, fake)) as gate:
        httpx2.patch(f"{gate.url}/admin/keys/{fingerprint(key)}", json={"run_max_repeats": 2}, headers=ADMIN)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "check"}]
        statuses = []
        for n in range(4):
            call = {"id": f"call_{n}", "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
            if n:
                messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": call["id"], "content": "same"}]
            resp = httpx2.post(f"{gate.url}/v1/chat/completions", json={
                "model": "deepseek-flash", "messages": messages, "tools": TOOLS,
                "thinking": {"type": "disabled"}},
                headers={"authorization": f"Bearer {key}", "x-chatgate-run": "looping"}, timeout=30)
            statuses.append(resp.status_code)
            assert resp.status_code in (200, 429), resp.text
    assert statuses == [200, 200, 429, 429]
    assert "run_max_repeats" in resp.json()["error"]["message"]


def test_runs_survive_a_restart_and_a_loop_goes_on_in_its_run(tmp_path: Path, fake: RunningFake) -> None:
    key = "sk-restart"
    settings = settings_for(tmp_path, fake)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Port the module"}]

    def step(url: str) -> None:
        resp = httpx2.post(f"{url}/v1/chat/completions", json={
            "model": "deepseek-flash", "messages": messages, "tools": TOOLS},
            headers={"authorization": f"Bearer {key}"}, timeout=30)
        assert resp.status_code == 200
        message = resp.json()["choices"][0]["message"]
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
        if message.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "ok"})
        else:
            messages.append({"role": "user", "content": "more"})

    with run_chatgate(settings) as gate:
        for _ in range(3):
            step(gate.url)
        before = runs_of(gate.url)
    with run_chatgate(settings) as gate:
        assert runs_of(gate.url) == [{**before[0], "ended": runs_of(gate.url)[0]["ended"]}]
        step(gate.url)
        after = runs_of(gate.url)
    assert len(before) == 1 and before[0]["requests"] == 3
    assert [(r["run_id"], r["requests"]) for r in after] == [(before[0]["run_id"], 4)]


def test_the_cli_lists_runs_and_shows_one_round_by_round(tmp_path: Path, fake: RunningFake,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_for(tmp_path, fake)
    with run_chatgate(settings) as gate:
        chat_loop(gate.url, "sk-cli", "Summarise the logs", 4, {"x-chatgate-run": "cli-run-1"})
        runs_of(gate.url)  # written by now
    store = settings.store.url
    assert main(["runs", "--store", store, "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["run_id"], r["requests"], r["rounds"]) for r in listed] == [("cli-run-1", 4, 4)]
    assert main(["runs", "--store", store]) == 0
    english = capsys.readouterr().out
    assert "cli-run-1" in english and english.split()[:3] == ["run", "team", "key"]
    assert main(["runs", "--store", store, "--lang", "zh"]) == 0
    chinese = capsys.readouterr().out  # issue 50: the heads in Chinese, the run id as it is
    assert chinese.split()[:4] == ["运行", "团队", "密钥", "请求"] and "rounds" not in chinese
    assert "cli-run-1" in chinese and max(text.width(line) for line in chinese.splitlines()) <= 120
    for name in ("LC_ALL", "LC_MESSAGES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    assert main(["runs", "--store", store]) == 0
    assert capsys.readouterr().out == chinese
    monkeypatch.delenv("LANG")
    assert main(["runs", "show", "cli-run", "--store", store]) == 0
    shown = capsys.readouterr().out
    assert "run cli-run-1" in shown and "read_file" in shown
    assert len([line for line in shown.splitlines() if line.startswith("   ") and "ok" in line]) == 4
    assert main(["runs", "show", "cli-run", "--store", store, "--format", "json"]) == 0
    steps = json.loads(capsys.readouterr().out)["rounds"]
    assert [s["context_tokens"] for s in steps] == sorted(s["context_tokens"] for s in steps)
    assert main(["runs", "show", "nope", "--store", store]) == 1


@pytest.mark.slow
def test_replicas_on_postgresql_share_runs_and_their_bounds(tmp_path: Path, fake: RunningFake) -> None:
    key = "sk-replicas"
    with fresh_database() as store:
        gates = []
        with run_chatgate(settings_for(tmp_path / "a", fake, store={"url": store},
                                       limits={"cache_seconds": 0})) as a, \
                run_chatgate(settings_for(tmp_path / "b", fake, store={"url": store},
                                          limits={"cache_seconds": 0})) as b:
            gates = [a, b]
            httpx2.patch(f"{a.url}/admin/keys/{fingerprint(key)}", json={"run_max_turns": 4}, headers=ADMIN)
            statuses = []
            for n in range(5):
                resp = httpx2.post(f"{gates[n % 2].url}/v1/chat/completions", json={
                    "model": "deepseek-flash", "messages": [{"role": "user", "content": f"step {n}"}]},
                    headers={"authorization": f"Bearer {key}", "x-chatgate-run": "shared-run"}, timeout=30)
                statuses.append(resp.status_code)
                time.sleep(0.3)  # each replica writes its runs every 0.2 s
            seen = [runs_of(g.url) for g in gates]
    assert statuses == [200, 200, 200, 200, 429]
    assert seen[0] == seen[1]
    assert [(r["run_id"], r["requests"], r["rounds"]) for r in seen[0]] == [("shared-run", 5, 4)]


@pytest.mark.slow
def test_an_inferred_loop_across_replicas_on_postgresql_is_one_run(tmp_path: Path, fake: RunningFake) -> None:
    """No header, no bounds: each replica only marks its requests, and the run is put together when read."""
    key = "sk-across"
    with fresh_database() as store, \
            run_chatgate(settings_for(tmp_path / "a", fake, store={"url": store})) as a, \
            run_chatgate(settings_for(tmp_path / "b", fake, store={"url": store})) as b:
        answers = chat_loop((a.url, b.url), key, "Port the parser", 5)
        assert [r.status_code for r in answers] == [200] * 5
        runs_of(a.url)
        seen = [runs_of(g.url) for g in (a, b)]
    assert seen[0] == seen[1]
    assert [(r["source"], r["requests"], r["rounds"]) for r in seen[0]] == [("inferred", 5, 5)]


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": "not a list"}, {"role": "user"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [1, {"id": None}]},
     {"role": "tool", "content": [3]}],
    [1, "two", {"role": "assistant", "content": {"x": [1.5, None]}}, {"role": "user", "content": "go"}],
    [{"role": "assistant"}, {"role": "assistant", "content": None}],
])
def test_odd_histories_are_refused_or_served_never_a_5xx(tmp_path: Path, fake: RunningFake,
                                                         messages: list[Any]) -> None:
    with run_chatgate(settings_for(tmp_path, fake)) as gate:
        resp = httpx2.post(f"{gate.url}/v1/chat/completions", json={
            "model": "deepseek-flash", "messages": messages, "tools": TOOLS},
            headers={"authorization": "Bearer sk-odd"}, timeout=30)
        assert resp.status_code < 500, resp.text
        runs_of(gate.url)  # the listing reads whatever was kept
