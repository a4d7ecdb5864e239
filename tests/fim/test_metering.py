"""FIM usage reconciled per key, as for chat (tests/metering/test_reconciliation.py): mixed FIM traffic for
three passthrough keys at once through a real chatgate to the fake DeepSeek; the exact tokens metered
equal what the fake issued per key, rejected, failed and cut-off requests are counted, a cut-off stream is
estimated, and the records carry the route `/beta/completions`."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest

from chatgate.gateway.auth import fingerprint
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import make_settings, run_chatgate
from tests.metering.helpers import chat_body, send_chat, usage_json, wait_for

pytestmark = pytest.mark.slow  # a module of metered traffic

KEYS = ("sk-fim-alpha-0001", "sk-fim-beta-0002", "sk-fim-gamma-0003")
TOKEN_FIELDS = ("prompt_tokens", "completion_tokens", "prompt_cache_hit_tokens", "prompt_cache_miss_tokens",
                "reasoning_tokens")
FIM = "/beta/completions"
FIM_EXACT = 6  # FIM answers per wave that carry DeepSeek's usage


@dataclass
class Traffic:
    db: Path
    store: str
    fake: RunningFake
    expected: dict[str, dict[str, int]]  # per key: rejected, upstream_errors, disconnected, chat


def fim(base: str, key: str, body: dict[str, Any], **headers: str) -> httpx2.Response:
    sent = {"authorization": f"Bearer {key}", "content-type": "application/json", **headers}
    return httpx2.post(base + FIM, content=orjson.dumps(body), headers=sent, timeout=20)


def disconnect_mid_stream(base: str, key: str) -> None:
    body = {"model": "deepseek-flash", "prompt": "class Stack:\n", "suffix": "\n", "stream": True}
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json",
               "x-fake-chunk-delay": "0.05"}
    with httpx2.stream("POST", base + FIM, content=orjson.dumps(body), headers=headers, timeout=10) as resp:
        seen = 0
        for piece in resp.iter_raw():
            seen += piece.count(b"data: {")
            if seen >= 3:
                break  # the editor moved on: the client goes away after a few tokens


def wave(base: str, key: str, k: int, expected: dict[str, int]) -> None:
    model = ("deepseek-flash", "deepseek-v4-pro")[k % 2]
    with openai.OpenAI(base_url=base + "/beta", api_key=key, max_retries=0) as client:
        for i in range(2):
            prompt = f"def f{i}(x):\n" + "    # step\n" * (i + k)
            reply = client.completions.create(model=model, prompt=prompt, suffix="    return x\n",
                                              max_tokens=256)
            assert reply.usage is not None and reply.choices[0].text
            chunks = list(client.completions.create(model=model, prompt=prompt, suffix="\n", stream=True))
            assert chunks[-1].usage is not None
        asked = list(client.completions.create(model=model, prompt="import os\n", stream=True,
                                               stream_options={"include_usage": True}))
        assert asked[-1].usage is not None
        cut = client.completions.create(model=model, prompt="x = ", max_tokens=2, echo=True)
        assert cut.choices[0].finish_reason == "length"
    for bad in ({"model": model, "prompt": "x", "max_tokens": 0},
                {"model": model, "prompt": ["a", "b"]},
                {"model": model, "prompt": "x", "stream_options": {"include_usage": True}}):
        assert fim(base, key, bad).status_code == 400
        expected["rejected"] += 1
    assert fim(base, key, {"model": model, "prompt": "y"}, **{"x-fake-fault": "http_500"}).status_code == 500
    expected["upstream_errors"] += 1
    disconnect_mid_stream(base, key)
    expected["disconnected"] += 1
    assert send_chat(base, chat_body(k), key).status_code == 200
    expected["chat"] += 1


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traffic]:
    tmp = tmp_path_factory.mktemp("fim-reconcile")
    counters = ("rejected", "upstream_errors", "disconnected", "chat")
    expected = {key: dict.fromkeys(counters, 0) for key in KEYS}
    with run_fake_deepseek() as fake, run_chatgate(make_settings(tmp, fake.url)) as gate:
        failures: list[BaseException] = []

        def run(key: str, k: int) -> None:
            try:
                wave(gate.url, key, k, expected[key])
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=run, args=(key, k)) for k, key in enumerate(KEYS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        if failures:
            raise failures[0]
        assert fake.state.wait_idle(10)
        total = len(fake.state.requests) + sum(e["rejected"] for e in expected.values())
        wait_for(lambda: count(tmp / "usage.db") == total, what="every request's record")
        wait_for(lambda: gate.state.recorder.pending == 0, what="records written")
    yield Traffic(tmp / "usage.db", f"sqlite:///{tmp}/usage.db", fake, expected)


def count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM usage").fetchone()[0])


def records(db: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute("SELECT * FROM usage")]
    finally:
        conn.close()


def test_exact_tokens_per_key_equal_what_the_fake_issued(traffic: Traffic) -> None:
    recs = records(traffic.db)
    for key in KEYS:
        mine = [r for r in recs if r["key_id"] == fingerprint(key)]
        issued = traffic.fake.state.issued_usage[key]
        exact_ok = [r for r in mine if r["tokens_exact"] and r["outcome"] == "ok"]
        assert len(exact_ok) == issued["requests"] == FIM_EXACT + traffic.expected[key]["chat"], key
        for name in TOKEN_FIELDS:
            assert sum(r[name] for r in exact_ok) == issued[name], (key, name)
        assert sum(r["outcome"] == "rejected" for r in mine) == traffic.expected[key]["rejected"]
        assert sum(r["outcome"] == "upstream_error" for r in mine) == traffic.expected[key]["upstream_errors"]
        gone = [r for r in mine if r["outcome"] == "client_disconnected"]
        assert len(gone) == traffic.expected[key]["disconnected"]
        assert all(not r["tokens_exact"] and r["completion_tokens"] >= 1 and r["prompt_tokens"] >= 1
                   for r in gone), "a cut-off FIM stream is estimated from its text"
        assert len({r["request_id"] for r in mine}) == len(mine), "one record per request"


def test_records_carry_the_fim_route(traffic: Traffic) -> None:
    recs = records(traffic.db)
    chats = sum(e["chat"] for e in traffic.expected.values())
    assert sum(r["route"] == "/v1/chat/completions" for r in recs) == chats
    assert all(r["route"] == FIM for r in recs if r["route"] != "/v1/chat/completions")
    fim_models = {r["model"] for r in recs if r["route"] == FIM}
    assert fim_models == {"deepseek-flash", "deepseek-v4-pro"}
    assert all(r["reasoning_tokens"] == 0 for r in recs if r["route"] == FIM), "FIM never thinks"
    rejected = [r for r in recs if r["outcome"] == "rejected"]
    assert {r["rule_code"] for r in rejected} == {"max_tokens_out_of_range", "invalid_type",
                                                   "stream_options_without_stream"}


def test_usage_report_by_key_adds_the_estimates(traffic: Traffic) -> None:
    report = usage_json(traffic.store, "key")
    rows = {row["key_id"]: row for row in report["rows"]}
    recs = records(traffic.db)
    for key in KEYS:
        estimated = sum(r["completion_tokens"] for r in recs
                        if r["key_id"] == fingerprint(key) and not r["tokens_exact"])
        row = rows[fingerprint(key)]
        issued = traffic.fake.state.issued_usage[key]["completion_tokens"]
        assert row["completion_tokens"] == issued + estimated
        assert row["rejected"] == traffic.expected[key]["rejected"]
