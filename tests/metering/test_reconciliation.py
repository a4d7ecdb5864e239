"""Reconciliation: mixed traffic for three passthrough keys through a real server to the fake DeepSeek;
the metered exact tokens equal what the fake issued, per key; rejected, failed and cut-off requests are
counted; costs follow the price table; `chatgate usage` reports it in json, csv and table form."""

from __future__ import annotations

import csv
import datetime as dt
import io
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from chatgate.gateway.auth import fingerprint
from chatgate.metering.reports import DERIVED, OUTPUT_COUNTERS, PICO_COUNTERS
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import make_settings, run_chatgate
from tests.metering.helpers import CHAT, WEATHER_TOOL, chat_body, cli, send_chat, usage_json, wait_for

pytestmark = pytest.mark.slow  # a module of metered traffic

KEYS = ("sk-alpha-0001", "sk-beta-0002", "sk-gamma-0003")
TOKEN_FIELDS = ("prompt_tokens", "completion_tokens", "prompt_cache_hit_tokens", "prompt_cache_miss_tokens",
                "reasoning_tokens")
REPORT_KEYS = {"group_by", "since", "until", "currency", "rows", "totals"}
COUNTER_KEYS = {*OUTPUT_COUNTERS, *DERIVED, *PICO_COUNTERS}
GROUP_KEYS = {"key": {"key_id", "key_name", "team"}, "team": {"team"}, "model": {"model"}, "day": {"day"},
              "rule": {"rule_code"}}


@dataclass
class Traffic:
    store: str
    db: Path
    fake: RunningFake
    split_ts: float  # every request of the second wave arrived at or after this time
    first_wave: int
    rejected: dict[str, int]
    estimated: dict[str, int]
    upstream_errors: dict[str, int]


def tool_loop(base_url: str, key: str, model: str) -> None:
    """An agent turn with the openai SDK: the model calls a tool, the client answers, the model replies."""
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "What's the weather in Oslo?"}]
    first = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL])  # type: ignore[list-item]
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 4, "sky": "overcast"}'})
    final = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL])  # type: ignore[list-item]
    assert "the tool said" in (final.choices[0].message.content or "")


def disconnect_mid_stream(base_url: str, key: str, rid: str) -> None:
    headers = {"authorization": f"Bearer {key}", "x-request-id": rid, "x-fake-chunk-delay": "0.05"}
    with httpx2.stream("POST", base_url + CHAT, json=chat_body(7, stream=True), headers=headers,
                       timeout=10) as resp:
        seen = 0
        for piece in resp.iter_raw():
            seen += piece.count(b"data: {")
            if seen >= 4:
                break  # the client goes away after the role chunk and a few tokens


def wave(url: str, key: str, k: int, tag: str, counts: dict[str, dict[str, int]]) -> None:
    model = ("deepseek-flash", "deepseek-v4-pro")[k % 2]
    for i in range(3):
        assert send_chat(url, chat_body(i + k, model=model), key, f"{tag}-{key}-n{i}").status_code == 200
        resp = send_chat(url, chat_body(i + 2 * k, stream=True, model=model), key, f"{tag}-{key}-s{i}")
        assert resp.status_code == 200 and resp.text.rstrip().endswith("[DONE]")
    streamed_with_usage = chat_body(5, stream=True, model=model, stream_options={"include_usage": True})
    assert send_chat(url, streamed_with_usage, key, f"{tag}-{key}-opt").status_code == 200
    tool_loop(url, key, model)
    # rejected locally (never reach the fake): empty messages, an orphan tool message, a wrong type
    for n, bad in enumerate([
        {"model": model, "messages": []},
        {"model": model, "messages": [{"role": "tool", "tool_call_id": "call_x", "content": "4C"}]},
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": "yes"},
    ]):
        assert send_chat(url, bad, key, f"{tag}-{key}-bad{n}").status_code == 400
    counts["rejected"][key] += 3
    for n, fault in enumerate(["http_500", "http_429"][: 1 + k % 2]):
        resp = send_chat(url, chat_body(n), key, f"{tag}-{key}-f{n}", headers={"x-fake-fault": fault})
        assert resp.status_code in (500, 429)
        counts["upstream_errors"][key] += 1
    disconnect_mid_stream(url, key, f"{tag}-{key}-gone")
    counts["estimated"][key] += 1


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traffic]:
    tmp = tmp_path_factory.mktemp("reconcile")
    counts: dict[str, dict[str, int]] = {n: dict.fromkeys(KEYS, 0) for n in ("rejected", "estimated",
                                                                          "upstream_errors")}
    with run_fake_deepseek() as fake:
        settings = make_settings(tmp, fake.url)
        with run_chatgate(settings) as cg:
            failures: list[BaseException] = []

            def run_wave(key: str, k: int) -> None:
                try:
                    wave(cg.url, key, k, "w1", counts)
                except BaseException as exc:
                    failures.append(exc)

            threads = [threading.Thread(target=run_wave, args=(key, k)) for k, key in enumerate(KEYS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            if failures:
                raise failures[0]
            first_wave = len(fake.state.requests)
            time.sleep(0.05)
            split = time.time()
            time.sleep(0.05)
            wave(cg.url, KEYS[0], 0, "w2", counts)
            assert fake.state.wait_idle(10)
            wait_for(lambda: cg.state.recorder.pending == 0, what="records written")
            # the disconnect records are finished in the background: wait until every request is stored
            wait_for(lambda: _count(tmp / "usage.db") == _expected_records(counts, fake), what="all records")
        yield Traffic(f"sqlite:///{tmp}/usage.db", tmp / "usage.db", fake, split, first_wave,
                      counts["rejected"], counts["estimated"], counts["upstream_errors"])


def _count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM usage").fetchone()[0])


def _expected_records(counts: dict[str, dict[str, int]], fake: RunningFake) -> int:
    return len(fake.state.requests) + sum(counts["rejected"].values())


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
        assert len(exact_ok) == issued["requests"], key
        for name in TOKEN_FIELDS:
            assert sum(r[name] for r in exact_ok) == issued[name], (key, name)
        assert sum(r["outcome"] == "rejected" for r in mine) == traffic.rejected[key]
        assert sum(r["outcome"] == "upstream_error" for r in mine) == traffic.upstream_errors[key]
        gone = [r for r in mine if r["outcome"] == "client_disconnected"]
        assert len(gone) == traffic.estimated[key]
        assert all(not r["tokens_exact"] and r["completion_tokens"] >= 1 for r in gone)
        assert all(r["prompt_tokens"] == 0 and r["cost_picousd"] == 0 for r in mine
                   if r["outcome"] in ("rejected", "upstream_error"))
        assert len({r["request_id"] for r in mine}) == len(mine), "one record per request"


def test_rejected_records_carry_their_rule_code(traffic: Traffic) -> None:
    rejected = [r for r in records(traffic.db) if r["outcome"] == "rejected"]
    assert rejected and all(r["rule_code"] for r in rejected)
    assert all(r["upstream_status"] is None for r in rejected)


# DeepSeek's peak prices (docs/metering.md#prices) in picoUSD per token (USD per 1M tokens x 10^6): cache hit,
# cache miss, output. Off peak is half; peak is 01:00-04:00 and 06:00-10:00 UTC. Written out here, not taken
# from chatgate's price table, so the test checks the product's pricing instead of repeating it.
PEAK_PICOUSD_PER_TOKEN = {"deepseek-flash": (6_000, 300_000, 1_200_000),
                          "deepseek-v4-pro": (44_000, 1_320_000, 3_960_000)}
PEAK_HOURS_UTC = {1, 2, 3, 6, 7, 8, 9}


def expected_cost(r: dict[str, Any]) -> int:
    hit, miss, out = PEAK_PICOUSD_PER_TOKEN[r["model"]]
    peak = dt.datetime.fromtimestamp(r["ts"], dt.UTC).hour in PEAK_HOURS_UTC
    cost = r["prompt_cache_hit_tokens"] * hit + r["prompt_cache_miss_tokens"] * miss
    cost += r["completion_tokens"] * out
    return cost if peak else cost // 2  # every price is even: halving is exact


def test_every_cost_is_the_price_table_at_the_record_time(traffic: Traffic) -> None:
    recs = records(traffic.db)
    for r in recs:
        assert r["cost_picousd"] == expected_cost(r), r
    assert sum(r["cost_picousd"] for r in recs if r["outcome"] == "ok") > 0
    report = usage_json(traffic.store, "key")
    assert report["totals"]["cost_picousd"] == sum(r["cost_picousd"] for r in recs)


@pytest.mark.parametrize("by", ["key", "team", "model", "day", "rule"])
def test_usage_json_shape_and_totals(traffic: Traffic, by: str) -> None:
    report = usage_json(traffic.store, by)
    recs = records(traffic.db)
    assert set(report) == REPORT_KEYS and report["group_by"] == by
    assert report["since"] is None and report["until"] is None
    for row in report["rows"]:
        assert set(row) == GROUP_KEYS[by] | COUNTER_KEYS, row
    assert set(report["totals"]) == COUNTER_KEYS
    totals = report["totals"]
    assert totals["requests"] == len(recs)
    assert totals["rejected"] == sum(traffic.rejected.values())
    assert totals["estimated_requests"] == sum(1 for r in recs if not r["tokens_exact"])
    for name in (*TOKEN_FIELDS, "requests", "rejected", "estimated_requests", "cost_picousd"):
        assert sum(row[name] for row in report["rows"]) == totals[name], name
    for name in TOKEN_FIELDS:
        assert totals[name] == sum(r[name] for r in recs), name
    assert totals["cost_usd"] == pytest.approx(totals["cost_picousd"] / 1e12, abs=1e-9)
    assert report["currency"] == totals["currency"] == "USD" and totals["cost"] == totals["cost_usd"]
    assert totals["cost_picocny"] == 0 and totals["cost_cny"] == 0


def test_usage_by_key_names_each_passthrough_fingerprint(traffic: Traffic) -> None:
    report = usage_json(traffic.store, "key")
    rows = {row["key_id"]: row for row in report["rows"]}
    assert set(rows) == {fingerprint(k) for k in KEYS}
    assert all(row["team"] == "default" for row in rows.values())
    assert all(k not in str(report) for k in KEYS), "the client's own key never appears"
    alpha = rows[fingerprint(KEYS[0])]
    assert alpha["rejected"] == traffic.rejected[KEYS[0]] == 6
    issued = traffic.fake.state.issued_usage[KEYS[0]]
    recs = records(traffic.db)
    estimated = [r for r in recs if r["key_id"] == fingerprint(KEYS[0]) and not r["tokens_exact"]]
    estimated_completion = sum(r["completion_tokens"] for r in estimated)
    assert alpha["completion_tokens"] == issued["completion_tokens"] + estimated_completion


def test_usage_by_model_and_day(traffic: Traffic) -> None:
    recs = records(traffic.db)
    by_model = {row["model"]: row["requests"] for row in usage_json(traffic.store, "model")["rows"]}
    assert by_model == {m: sum(r["model"] == m for r in recs) for m in {r["model"] for r in recs}}
    assert set(by_model) == {"deepseek-flash", "deepseek-v4-pro"}
    by_day = usage_json(traffic.store, "day")["rows"]
    assert [row["day"] for row in by_day] == sorted({r["day"] for r in recs})


def test_since_and_until_split_the_two_waves(traffic: Traffic) -> None:
    recs = records(traffic.db)
    later = [r for r in recs if r["ts"] >= traffic.split_ts]
    assert 0 < len(later) < len(recs)
    since = usage_json(traffic.store, "key", "--since", str(traffic.split_ts))
    until = usage_json(traffic.store, "key", "--until", str(traffic.split_ts))
    assert since["since"] == traffic.split_ts
    assert since["totals"]["requests"] == len(later)
    assert until["totals"]["requests"] == len(recs) - len(later)
    assert [row["key_id"] for row in since["rows"]] == [fingerprint(KEYS[0])]
    for name in TOKEN_FIELDS:
        assert since["totals"][name] + until["totals"][name] == sum(r[name] for r in recs)
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(traffic.split_ts + 3600))
    assert usage_json(traffic.store, "team", "--since", iso)["rows"] == []
    bad = cli("usage", "--since", "yesterday-ish", "--store", traffic.store, check=False)
    assert bad.returncode == 2 and "--since" in bad.stderr


def test_usage_csv_has_a_header_the_rows_and_a_totals_row(traffic: Traffic) -> None:
    report = usage_json(traffic.store, "team")
    out = cli("usage", "--by", "team", "--format", "csv", "--store", traffic.store).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["team", *OUTPUT_COUNTERS, *DERIVED]
    assert [r["team"] for r in rows] == ["default", "TOTAL"]
    assert int(rows[-1]["requests"]) == report["totals"]["requests"]
    assert int(rows[-1]["prompt_tokens"]) == report["totals"]["prompt_tokens"]
    assert float(rows[-1]["cost_usd"]) == pytest.approx(report["totals"]["cost_usd"])


def test_usage_table_ends_with_a_totals_line(traffic: Traffic) -> None:
    report = usage_json(traffic.store, "model")
    lines = cli("usage", "--by", "model", "--store", traffic.store).stdout.rstrip("\n").splitlines()
    assert lines[0].split()[:3] == ["model", "requests", "rejected"]
    end = next(i for i, line in enumerate(lines) if line.startswith("TOTAL"))  # notes may follow it
    assert {line.split()[0] for line in lines[2:end - 1]} == {"deepseek-flash", "deepseek-v4-pro"}
    total = lines[end].split()
    assert total[0] == "TOTAL" and int(total[1]) == report["totals"]["requests"]
    assert int(total[6]) == report["totals"]["prompt_tokens"]  # after the 4 outcome columns


def test_usage_by_rule_counts_each_rejecting_rule(traffic: Traffic) -> None:
    report = usage_json(traffic.store, "rule")
    rejected = {row["rule_code"]: row["rejected"] for row in report["rows"] if row["rule_code"]}
    expected = Counter(r["rule_code"] for r in records(traffic.db) if r["outcome"] == "rejected")
    assert rejected == expected and len(expected) == 3  # empty messages, orphan tool message, bad type
    assert sum(rejected.values()) == sum(traffic.rejected.values())
    passed = [row for row in report["rows"] if not row["rule_code"]]
    assert len(passed) == 1 and passed[0]["rejected"] == 0
