"""The refusal inspector under attack (issue 48, findings 6 and 9): a problem message quoting the client's
value is redacted as the body is; each kept refusal is bounded (64 KB); `GET /admin/refusals` comes a page
at a time; chatgate's own ids are random, and a client's x-request-id is never the inspector's key: a
request id that several keys' refusals carry is a 409 naming them, never the newest one's body.

Figures (2026-12-07, smaller than the attack's 4 MiB field and 42 MB request): a 1 MiB `detail` holding a
password: before, the whole value kept in the problem under `"redacted": true` (1 MB a refusal); after, the
kept refusal is under 64 KB and holds 32 characters of the value."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from chatgate.cli import main
from chatgate.ids import new_id
from tests.fakes.server import run_fake_deepseek
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate

SECRET = "password=hunter2-" + "p" * (1024 * 1024)


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningChatgate]:
    with run_fake_deepseek() as fake, run_chatgate(make_settings(
            tmp_path_factory.mktemp("inspector"), fake.url, auth={"admin_key": ADMIN_KEY})) as running:
        yield running


def admin(gate: RunningChatgate, path: str) -> httpx2.Response:
    return httpx2.get(gate.url + path, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)


def refuse(gate: RunningChatgate, key: str, request_id: str, detail: str = "huge") -> None:
    part = {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": detail}}
    body = {"model": "deepseek-flash", "messages": [{"role": "user", "content": [part]}]}
    resp = httpx2.post(gate.url + "/v1/chat/completions", content=orjson.dumps(body), timeout=30,
                       headers={"authorization": f"Bearer {key}", "x-request-id": request_id,
                                "content-type": "application/json"})
    assert resp.status_code == 400, resp.text[:300]


def kept(gate: RunningChatgate, ok: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while True:
        rows: list[dict[str, Any]] = admin(gate, "/admin/refusals?limit=1000").json()["data"]
        if ok(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def test_a_quoted_value_in_a_problem_is_redacted_and_a_refusal_is_bounded(gate: RunningChatgate) -> None:
    refuse(gate, "sk-inspector-a", "req-secret-1", SECRET)
    rows = kept(gate, lambda rows: any(r["request_id"] == "req-secret-1" for r in rows))
    row = next(r for r in rows if r["request_id"] == "req-secret-1")
    shown = admin(gate, f"/admin/refusals/{row['refusal_id']}").json()
    problems = orjson.dumps(shown["problems"]).decode()
    assert shown["redacted"] is True and SECRET[:200] not in problems and SECRET[:200] not in shown["body"]
    assert SECRET[:32] in problems and f"[{len(SECRET)} chars]" in problems
    assert len(orjson.dumps(shown["problems"])) + len(shown["body"]) <= 64 * 1024


def test_the_list_comes_a_page_at_a_time(gate: RunningChatgate, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    for n in range(5):
        refuse(gate, "sk-inspector-pages", f"req-page-{n}")
    kept(gate, lambda rows: sum(r["request_id"].startswith("req-page-") for r in rows) == 5)
    seen: list[str] = []
    cursor = ""
    for _ in range(10):
        page = admin(gate, f"/admin/refusals?limit=2&key={fp('sk-inspector-pages')}{cursor}").json()
        assert len(page["data"]) <= 2
        seen += [r["request_id"] for r in page["data"]]
        if not page["has_more"]:
            break
        cursor = f"&cursor={page['next_cursor']}"
    assert sorted(seen) == [f"req-page-{n}" for n in range(5)], "every refusal once, newest first"
    assert admin(gate, "/admin/refusals?limit=0").status_code == 400
    assert admin(gate, "/admin/refusals?cursor=nonsense").status_code == 400
    store = gate.state.settings.store.url
    assert main(["refusals", "list", "--store", store, "--key", fp("sk-inspector-pages"), "--limit",
                 "3"]) == 0
    out = capsys.readouterr().out
    assert "(more: --cursor " in out and sum(f"req-page-{n}" in out for n in range(5)) == 3


def fp(secret: str) -> str:
    from chatgate.gateway.auth import fingerprint
    return fingerprint(secret)


def test_a_reused_request_id_never_shows_another_callers_refusal(gate: RunningChatgate) -> None:
    refuse(gate, "sk-victim-0001", "req-shared-1")
    refuse(gate, "sk-attacker-0001", "req-shared-1")  # the attacker names the victim's id
    rows = kept(gate, lambda rows: sum(r["request_id"] == "req-shared-1" for r in rows) == 2)
    both = [r for r in rows if r["request_id"] == "req-shared-1"]
    resp = admin(gate, "/admin/refusals/req-shared-1")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "ambiguous_request_id"
    assert {c["refusal_id"] for c in resp.json()["candidates"]} == {r["refusal_id"] for r in both}
    victim = admin(gate, f"/admin/refusals/req-shared-1?key={fp('sk-victim-0001')}").json()
    assert victim["key_id"] == fp("sk-victim-0001")
    for r in both:
        assert admin(gate, f"/admin/refusals/{r['refusal_id']}").json()["key_id"] == r["key_id"]


def test_chatgates_own_ids_are_random() -> None:
    ids = [new_id() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(len(i) == 32 for i in ids)
    assert len({i[:16] for i in ids}) == 1000, "no prefix shared by a process's ids"
