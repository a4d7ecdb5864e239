"""The tool APIs end to end (issue 46 §2): chatgate on a loopback port in front of the fake DeepSeek, the
openai SDK's raw `post` (as the SDKs' users call routes they have no method for) or httpx as the client.

What a caller sees: its call forwarded byte for byte with its own key (passthrough) or an account's
(managed), DeepSeek's answer relayed (OCR's keep-alives as they come), DeepSeek's documented refusals made
locally (T2-T8) in OpenAI's error shape; and what is metered: one record per call, the tool as its model,
its billed units and their cost (an empty result, an error: free), in reports and /metrics, within the
caller's budget."""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
import orjson
import pytest

from chatgate.gateway.auth import fingerprint, new_key
from chatgate.metering.reports import build_report, render_table
from chatgate.store.base import ReportQuery
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake
from tests.gateway.conftest import usage_rows
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate
from tests.quotas.support import set_limits, usd

KEY = "sk-test-client-0001"
UPSTREAM = "sk-upstream-account-key"
CALL = 750_000_000  # picoUSD: $0.75 per 1,000 calls
MiB = 1024 * 1024


def sdk(gate: RunningChatgate, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gate.url + "/v1", api_key=key, max_retries=0, timeout=30)


def post(gate: RunningChatgate, path: str, body: dict[str, Any], key: str = KEY,
         headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.post(gate.url + path, content=orjson.dumps(body), timeout=30, headers={
        "content-type": "application/json", "authorization": f"Bearer {key}", **(headers or {})})


def upload(gate: RunningChatgate, path: str, file: bytes, headers: dict[str, str] | None = None,
           **fields: str) -> httpx2.Response:
    return httpx2.post(gate.url + path, files={"file": ("doc.pdf", file, "application/pdf")}, data=fields,
                       headers={"authorization": f"Bearer {KEY}", **(headers or {})}, timeout=30)


def error_of(resp: httpx2.Response) -> dict[str, Any]:
    error: dict[str, Any] = resp.json()["error"]
    return error


def billed(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["model"], row["route"], row["outcome"], row["billed_units"], row["billed_unit"],
            row["billed_picousd"], row["cost_picousd"], bool(row["unpriced"]))


def test_a_search_is_forwarded_byte_for_byte_and_billed_one_call(gate: RunningChatgate, fake: RunningFake,
                                                                 tmp_path: Path) -> None:
    body = {"query": "deepseek site:github.com", "count": 3, "need_content": False, "a_new_field": 1}
    answer = sdk(gate).post("/tools/search", body=body, cast_to=httpx.Response)
    assert answer.status_code == 200
    assert [r["title"] for r in answer.json()["results"]] == [
        f"Result {n} for deepseek site:github.com" for n in range(3)]
    sent = fake.state.requests[-1]
    assert (sent.path, sent.auth_key, orjson.loads(sent.body)) == ("/v1/tools/search", KEY, body)
    [row] = usage_rows(tmp_path, 1)
    assert billed(row) == ("search", "/tools/search", "ok", 1, "call", CALL, CALL, False)
    assert (row["key_id"], row["upstream_status"], row["tokens_exact"], row["billed_estimated"]) == (
        fingerprint(KEY), 200, 1, 0)


def test_an_empty_search_an_empty_page_and_an_error_are_free(gate: RunningChatgate, fake: RunningFake,
                                                            tmp_path: Path) -> None:
    assert post(gate, "/v1/tools/search", {"query": "nothing at all"}).json()["results"] == []
    assert post(gate, "/tools/fetch", {"url": "https://example.com/empty"}).json()["content"] == ""
    failed = post(gate, "/v1/tools/fetch", {"url": "https://example.com/a"}, headers={
        "x-fake-fault": "http_500"})
    assert failed.status_code == 500 and error_of(failed)["message"] == "Internal Server Error"
    rows = usage_rows(tmp_path, 3)
    assert [billed(r) for r in rows] == [
        ("search", "/tools/search", "ok", 0, "call", 0, 0, False),
        ("fetch", "/tools/fetch", "ok", 0, "call", 0, 0, False),
        ("fetch", "/tools/fetch", "upstream_error", 0, None, 0, 0, False)]


def test_a_fetch_returns_the_markdown_and_is_billed_one_call(gate: RunningChatgate, tmp_path: Path) -> None:
    page = post(gate, "/tools/fetch", {"url": "https://example.com/a", "offset": 0})
    assert page.status_code == 200 and page.json()["content"].startswith("# A page")
    [row] = usage_rows(tmp_path, 1)
    assert billed(row) == ("fetch", "/tools/fetch", "ok", 1, "call", CALL, CALL, False)


@pytest.mark.parametrize(("path", "body", "param", "code", "rule"), [
    ("/v1/tools/search", {"query": "x" * 129}, "query", "invalid_query", "T2"),
    ("/v1/tools/search", {"query": ""}, "query", "invalid_query", "T2"),
    ("/v1/tools/search", {"count": 5}, "query", "missing_required_parameter", "T2"),
    ("/tools/search", {"query": "ok", "count": 51}, "count", "invalid_count", "T3"),
    ("/tools/search", {"query": "ok", "count": 0}, "count", "invalid_count", "T3"),
    ("/v1/tools/fetch", {"url": "https://example.com/" + "a" * 8173}, "url", "invalid_url", "T4"),
    ("/v1/tools/fetch", {}, "url", "missing_required_parameter", "T4"),
])
def test_what_deepseek_documents_as_invalid_is_refused_locally(
        gate: RunningChatgate, fake: RunningFake, tmp_path: Path, path: str, body: dict[str, Any], param: str,
        code: str, rule: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(gate).post(path.removeprefix("/v1"), body=body, cast_to=httpx.Response)
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert [(p["code"], p["rule"]) for p in error["problems"]] == [(code, rule)]
    assert fake.state.requests == [], "nothing reached DeepSeek"
    [row] = usage_rows(tmp_path, 1)
    assert (row["model"], row["outcome"], row["rule_code"], row["cost_picousd"]) == (
        path.rsplit("/", 1)[1], "rejected", code, 0)


def test_the_longest_valid_query_and_url_and_a_wrong_type_are_forwarded(gate: RunningChatgate,
                                                                        fake: RunningFake) -> None:
    assert post(gate, "/v1/tools/search", {"query": "界" * 128, "count": 50}).status_code == 200
    assert post(gate, "/v1/tools/fetch", {"url": "https://example.com/" + "a" * 8172}).status_code == 200
    typed = post(gate, "/v1/tools/search", {"query": "ok", "count": "5"})
    assert typed.status_code == 400, "DeepSeek's own refusal, relayed"
    assert "T3" not in typed.text and "count" in typed.headers["x-chatgate-warning"]
    assert len(fake.state.requests) == 3


def test_strict_mode_refuses_what_is_only_a_warning(start_gate: Callable[..., RunningChatgate],
                                                     fake: RunningFake) -> None:
    gate = start_gate(validation={"strict": True})
    refused = post(gate, "/v1/tools/search", {"query": "ok", "count": "5"})
    assert refused.status_code == 400 and error_of(refused)["code"] == "invalid_type"
    assert fake.state.requests == []


@pytest.mark.slow  # the fake's keep-alives come 0.3 s apart, in real time
def test_ocr_relays_the_keepalives_as_they_come_then_bills_its_pages(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path) -> None:
    fake.state.configure(chunk_delay=0.3)
    gate = start_gate()
    document = b"%PDF-1.7 page one\fpage two\fpage three"
    chunks: list[bytes] = []
    with httpx2.Client(timeout=30) as client, client.stream(
            "POST", gate.url + "/v1/tools/ocr", files={"file": ("doc.pdf", document, "application/pdf")},
            data={"purpose": "rich_layout_recognition"},
            headers={"authorization": f"Bearer {KEY}", "x-fake-keepalives": "3"}) as resp:
        assert resp.status_code == 200
        chunks.extend(resp.iter_raw())
    assert chunks[0] == b"\n", "the first keep-alive reached the client before the answer existed"
    whole = b"".join(chunks)
    assert whole.startswith(b"\n\n\n{") and len(orjson.loads(whole)["pages"]) == 3
    sent = fake.state.requests[-1]
    assert sent.path == "/v1/tools/ocr" and document in sent.body and b"rich_layout_recognition" in sent.body
    [row] = usage_rows(tmp_path, 1)
    assert billed(row) == ("ocr", "/tools/ocr", "ok", 3, "page", 0, 0, True), "pages, USD price unknown"


def test_an_ocr_purpose_deepseek_does_not_document_is_forwarded_with_a_warning(gate: RunningChatgate,
                                                                               fake: RunningFake) -> None:
    resp = upload(gate, "/tools/ocr", b"one page", purpose="handwriting")
    assert resp.status_code == 200 and "T7" not in resp.text
    assert "purpose" in resp.headers["x-chatgate-warning"]
    assert len(fake.state.requests) == 1


def test_an_ocr_upload_without_a_file_is_refused(gate: RunningChatgate, fake: RunningFake) -> None:
    resp = httpx2.post(gate.url + "/v1/tools/ocr", files={"document": (None, "x")},
                       headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    assert resp.status_code == 400 and (error_of(resp)["code"], error_of(resp)["param"]) == (
        "missing_required_parameter", "file")
    assert fake.state.requests == []


def test_asr_audio_over_8_mib_is_refused_locally(gate: RunningChatgate, fake: RunningFake,
                                                 tmp_path: Path) -> None:
    ok = upload(gate, "/v1/tools/asr", b"RIFF" + b"\x00" * 1000)
    assert ok.status_code == 200 and ok.json()["text"] == "1004 bytes of speech"
    over = upload(gate, "/v1/tools/asr", b"\x00" * (8 * MiB + 1))
    assert over.status_code == 400 and error_of(over)["problems"][0]["rule"] == "T8"
    far_over = upload(gate, "/v1/tools/asr", b"\x00" * (9 * MiB + 1))
    assert far_over.status_code == 413 and error_of(far_over)["code"] == "file_too_large"
    assert len(fake.state.requests) == 1
    rows = usage_rows(tmp_path, 2)  # the 413 is refused before the body is read: no record, as on chat
    assert [(r["model"], r["outcome"], r["unpriced"]) for r in rows] == [
        ("asr", "ok", 1), ("asr", "rejected", 0)]


def test_tts_relays_the_audio_and_meters_the_characters(gate: RunningChatgate, tmp_path: Path) -> None:
    text = "你好, DeepSeek"
    resp = post(gate, "/v1/tools/tts", {"input": text, "voice": "default"})
    assert resp.status_code == 200 and resp.headers["content-type"] == "audio/mpeg"
    assert resp.content == b"ID3\x04fake" + bytes(ord(c) % 256 for c in text)
    [row] = usage_rows(tmp_path, 1)
    assert billed(row) == ("tts", "/tools/tts", "ok", len(text), "character", 0, 0, True)
    assert row["billed_estimated"] == 1, "how DeepSeek counts characters is not documented"


def test_a_503_before_the_answer_is_retried(start_gate: Callable[..., RunningChatgate], fake: RunningFake,
                                            tmp_path: Path) -> None:
    gate = start_gate(upstream={"retries": 2, "retry_base_ms": 1})
    resp = post(gate, "/v1/tools/search", {"query": "retry me"}, headers={
        "x-fake-fault": "http_503", "x-fake-fault-attempts": "1"})
    assert resp.status_code == 200 and resp.headers["x-chatgate-attempts"] == "2"
    assert [r.status for r in fake.state.requests] == [503, 200]
    [row] = usage_rows(tmp_path, 1)
    assert (row["attempts"], row["billed_units"], row["cost_picousd"]) == (2, 1, CALL)


def test_an_ocr_attempt_dropped_after_keepalives_is_retried_on_the_same_response(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path) -> None:
    gate = start_gate(upstream={"retries": 2, "retry_base_ms": 1})
    resp = upload(gate, "/v1/tools/ocr", b"a\fb", purpose="text_recognition", headers={
        "x-fake-keepalives": "2", "x-fake-fault": "reset_mid_stream", "x-fake-fault-attempts": "1"})
    assert resp.status_code == 200
    assert resp.content.startswith(b"\n\n") and len(orjson.loads(resp.content)["pages"]) == 2
    assert [r.outcome for r in fake.state.requests] == ["reset", "completed"]
    [row] = usage_rows(tmp_path, 1)
    assert (row["attempts"], row["outcome"], row["billed_units"]) == (2, "ok", 2)


def test_managed_mode_sends_an_accounts_key_and_meters_the_team(tmp_path: Path, fake: RunningFake) -> None:
    store = SQLiteStore(tmp_path / "usage.db")
    settings = make_settings(tmp_path, fake.url, auth={
        "mode": "managed", "upstream_api_key": UPSTREAM, "key_cache_seconds": 0}, limits={"cache_seconds": 0})
    with run_chatgate(settings, store=store) as gate:
        key_id, secret, digest, prefix = new_key()
        store.create_key(key_id, digest, prefix, "search-team", "crawler")
        assert post(gate, "/v1/tools/search", {"query": "x"}, key="cg-nobody").status_code == 401
        assert post(gate, "/v1/tools/search", {"query": "managed"}, key=secret).status_code == 200
        assert upload_as(gate, secret).status_code == 200
        assert [r.auth_key for r in fake.state.requests] == [UPSTREAM, UPSTREAM]
        rows = usage_rows(tmp_path, 2)
    assert [(r["model"], r["key_id"], r["team"], r["billed_units"]) for r in rows] == [
        ("search", key_id, "search-team", 1), ("ocr", key_id, "search-team", 1)]


def upload_as(gate: RunningChatgate, secret: str) -> httpx2.Response:
    return httpx2.post(gate.url + "/v1/tools/ocr", files={"file": ("a.png", b"\x89PNG", "image/png")},
                       data={"purpose": "text_recognition"}, headers={"authorization": f"Bearer {secret}"},
                       timeout=30)


def test_a_budget_reserves_one_call_and_refuses_the_call_it_cannot_pay(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path) -> None:
    gate = start_gate(limits={"cache_seconds": 0})
    set_limits(f"sqlite:///{tmp_path}/usage.db", "key", fingerprint(KEY), budget_picousd=2 * CALL,
               budget_period="month")
    assert post(gate, "/v1/tools/search", {"query": "nothing"}).status_code == 200  # free: spends nothing
    assert post(gate, "/v1/tools/search", {"query": "one"}).status_code == 200
    assert post(gate, "/v1/tools/fetch", {"url": "https://example.com/two"}).status_code == 200
    refused = post(gate, "/v1/tools/search", {"query": "three"})
    assert refused.status_code == 429 and error_of(refused)["code"] == "insufficient_quota"
    ocr = upload(gate, "/v1/tools/ocr", b"page", purpose="text_recognition")
    assert ocr.status_code == 429, "a budget spent refuses a call of unknown price too"
    assert len(fake.state.requests) == 3
    rows = usage_rows(tmp_path, 5)
    assert [(r["model"], r["outcome"], r["cost_picousd"]) for r in rows] == [
        ("search", "ok", 0), ("search", "ok", CALL), ("fetch", "ok", CALL), ("search", "limited", 0),
        ("ocr", "limited", 0)]
    assert usd("0.0015") == 2 * CALL


def test_reports_and_metrics_show_the_calls_and_their_cost(gate: RunningChatgate, tmp_path: Path) -> None:
    for query in ("one", "two", "nothing"):
        post(gate, "/v1/tools/search", {"query": query})
    post(gate, "/v1/tools/fetch", {"url": "https://example.com/a"})
    upload(gate, "/v1/tools/ocr", b"a\fb\fc", purpose="text_recognition")
    usage_rows(tmp_path, 5)
    store = SQLiteStore(tmp_path / "usage.db")
    try:
        report = build_report(store, ReportQuery("model"))
    finally:
        store.close()
    rows = {r["model"]: r for r in report["rows"]}
    assert (rows["search"]["requests"], rows["search"]["billed_calls"], rows["search"]["billed_usd"],
            rows["search"]["cost_usd"]) == (3, 2, 0.0015, 0.0015)
    assert (rows["fetch"]["billed_calls"], rows["fetch"]["cost_usd"]) == (1, 0.00075)
    ocr = rows["ocr"]
    assert (ocr["billed_pages"], ocr["cost_usd"], ocr["unpriced_requests"]) == (3, 0, 1)
    assert report["totals"]["billed_calls"] == 3 and report["unpriced_models"] == ["ocr"]
    table = render_table(report)
    search_line = next(line for line in table.splitlines() if line.startswith("search"))
    assert re.search(r" 2 +\$0\.0015 +\$0\.0015 ", search_line), table  # calls, calls_usd, cost_usd
    assert "3 OCR page(s)" in table
    metrics = httpx2.get(gate.url + "/metrics").text
    assert 'chatgate_billed_calls_total{source="api",tool="search",unit="call"} 2.0' in metrics
    assert 'chatgate_billed_calls_total{source="api",tool="ocr",unit="page"} 3.0' in metrics
    assert 'route="/tools/search",status="200"' in metrics


def test_migration_10_keeps_old_records_with_no_billed_units(tmp_path: Path) -> None:
    from chatgate.store._sql import CREATE_SCHEMA_VERSION, MIGRATIONS

    db = tmp_path / "v9.db"
    conn = sqlite3.connect(db)
    conn.execute(CREATE_SCHEMA_VERSION)
    for version in range(1, 10):
        for statement in MIGRATIONS[version - 1]:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version VALUES (?, 0)", (version,))
    conn.execute("INSERT INTO usage (record_id, ts, day, request_id, key_id, key_name, team, model, route, "
                 "stream, outcome, prompt_tokens, completion_tokens, prompt_cache_hit_tokens, "
                 "prompt_cache_miss_tokens, reasoning_tokens, cost_picousd, latency_ms, tokens_exact) VALUES "
                 "('old', 1.0, '1970-01-01', 'r', 'k', 'k', 't', 'deepseek-flash', '/chat/completions', 0, "
                 "'ok', 1, 1, 0, 1, 0, 5, 1.0, 1)")
    conn.commit()
    conn.close()
    store = SQLiteStore(db)
    try:
        store.migrate()
        [row] = store.usage_report(ReportQuery("model"))
        counted = row.counters
        assert (counted["billed_calls"], counted["billed_picousd"], counted["cost_picousd"]) == (0, 0, 5)
    finally:
        store.close()


def test_each_call_has_an_access_log_line_with_its_billed_units(
        start_gate: Callable[..., RunningChatgate], capfd: pytest.CaptureFixture[str]) -> None:
    gate = start_gate(server={"access_log": True})
    post(gate, "/v1/tools/search", {"query": "logged"}, headers={"x-request-id": "req-search"})
    post(gate, "/v1/tools/search", {"query": "x" * 200}, headers={"x-request-id": "req-refused"})
    gate.state.gw.ledger.access_log.flush()
    out = capfd.readouterr().out
    found = [orjson.loads(line) for line in out.splitlines() if line.startswith('{"event":"request"')]
    lines = {line["request_id"]: line for line in found}
    assert (lines["req-search"]["route"], lines["req-search"]["model"], lines["req-search"]["billed_units"],
            lines["req-search"]["billed_unit"], lines["req-search"]["cost_picousd"]) == (
        "/tools/search", "search", 1, "call", CALL)
    assert lines["req-refused"]["rule_code"] == "invalid_query" and "billed_units" not in lines["req-refused"]


@pytest.mark.slow  # waits the upstream timeout out
def test_a_search_that_times_out_is_free(start_gate: Callable[..., RunningChatgate], fake: RunningFake,
                                         tmp_path: Path) -> None:
    gate = start_gate(upstream={"read_timeout": 0.5})
    resp = post(gate, "/v1/tools/search", {"query": "slow"}, headers={
        "x-fake-fault": "no_headers", "x-fake-delay": "3"})
    assert resp.status_code == 504
    [row] = usage_rows(tmp_path, 1)
    assert (row["model"], row["outcome"], row["billed_units"], row["cost_picousd"]) == (
        "search", "upstream_failed", 0, 0)


def test_when_the_retries_are_spent_deepseeks_last_error_is_relayed_and_free(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path) -> None:
    gate = start_gate(upstream={"retries": 1, "retry_base_ms": 1})
    resp = post(gate, "/v1/tools/fetch", {"url": "https://example.com/a"},
                headers={"x-fake-fault": "http_503"})
    assert resp.status_code == 503 and resp.headers["x-should-retry"] == "false"
    message = error_of(resp)["message"]
    assert message.startswith("Server Overloaded") and "2 attempts" in message
    assert len(fake.state.requests) == 2
    [row] = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["upstream_status"], row["attempts"], row["cost_picousd"]) == (
        "upstream_error", 503, 2, 0)


@pytest.mark.slow  # the fake's keep-alives come 0.5 s apart, in real time
def test_a_client_gone_during_the_keepalives_closes_the_upstream_and_is_recorded(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path) -> None:
    fake.state.configure(chunk_delay=0.5)
    gate = start_gate()
    with httpx2.Client(timeout=30) as client, client.stream(
            "POST", gate.url + "/v1/tools/ocr", files={"file": ("doc.pdf", b"a\fb", "application/pdf")},
            data={"purpose": "text_recognition"},
            headers={"authorization": f"Bearer {KEY}", "x-fake-keepalives": "20"}) as resp:
        assert next(resp.iter_raw()) == b"\n"
    [row] = usage_rows(tmp_path, 1)
    assert (row["model"], row["outcome"], row["billed_units"]) == ("ocr", "client_disconnected", 0)
    assert fake.state.wait_idle(10) and fake.state.requests[-1].outcome == "client_disconnected"


def test_the_refusal_inspector_keeps_a_refused_call_and_only_the_shape_of_an_upload(
        start_gate: Callable[..., RunningChatgate]) -> None:
    admin = ADMIN_KEY
    gate = start_gate(auth={"admin_key": admin})
    audio = b"\x00" * (8 * MiB + 1)
    assert upload(gate, "/v1/tools/asr", audio, headers={"x-request-id": "req-asr"}).status_code == 400
    assert post(gate, "/v1/tools/search", {"query": "q" * 129}, headers={"x-request-id": "req-q"}
                ).status_code == 400

    def shown(request_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + 10
        while True:
            resp = httpx2.get(f"{gate.url}/admin/refusals/{request_id}", timeout=10,
                              headers={"authorization": f"Bearer {admin}"})
            if resp.status_code == 200 or time.monotonic() > deadline:
                kept: dict[str, Any] = resp.json()
                return kept
            time.sleep(0.05)

    asr, search = shown("req-asr"), shown("req-q")
    assert (asr["route"], asr["rules"], search["rules"]) == ("/tools/asr", ["T8"], ["T2"])
    assert orjson.loads(asr["body"]) == {"upload": [{"name": "file", "filename": "doc.pdf",
                                                     "bytes": 8 * MiB + 1}]}


def test_the_dry_runs_check_and_forward_nothing(gate: RunningChatgate, fake: RunningFake,
                                                tmp_path: Path) -> None:
    valid = post(gate, "/v1/tools/search/validate", {"query": "q", "count": "5"})
    assert valid.status_code == 200
    assert (valid.json()["valid"], valid.json()["model"], [w["rule"] for w in valid.json()["warnings"]]) == (
        True, "search", ["T3"])
    assert error_of(post(gate, "/tools/fetch/validate", {"url": "u" * 8193}))["code"] == "invalid_url"
    ocr = upload(gate, "/v1/tools/ocr/validate", b"page", purpose="handwriting")
    assert ocr.status_code == 200 and [w["rule"] for w in ocr.json()["warnings"]] == ["T7"]
    asr = upload(gate, "/v1/tools/asr/validate", b"\0" * (8 * MiB + 1))
    assert asr.status_code == 400 and error_of(asr)["problems"][0]["rule"] == "T8"
    assert fake.state.requests == []
    assert not (tmp_path / "usage.db").exists() or usage_rows(tmp_path, 0) == []
