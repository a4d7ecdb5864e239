"""R1 as DeepSeek's serde front-end reads JSON (issue 34 §4, §9, §11): a body it refuses is refused locally,
in the route's shape, before anything reaches DeepSeek: duplicate keys, NaN / Infinity / numbers beyond a
double, nesting deeper than 128, a NUL in `model`. A non-finite number no longer hides a file id from the
owner check. A plain body costs one extra Rust parse (chatgate/gateway/strict.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import orjson
import pytest

from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake
from tests.files.test_files import Teams, start_teams
from tests.gateway.conftest import JSON_HEADERS, usage_rows
from tests.harness import RunningChatgate

CHAT = b'{"model":"deepseek-flash","messages":[{"role":"user","content":"hi"}]'
ANTHROPIC = b'{"model":"deepseek-flash","max_tokens":10,"messages":[{"role":"user","content":"hi"}]'
RESPONSES = b'{"model":"deepseek-flash","input":"hi"'
ROUTES = [("/v1/chat/completions", CHAT), ("/anthropic/v1/messages", ANTHROPIC), ("/v1/responses", RESPONSES)]


def post(gate: RunningChatgate, path: str, body: bytes, key: str = "sk-test-client-0001") -> httpx2.Response:
    return httpx2.post(gate.url + path, content=body, timeout=20,
                       headers={**JSON_HEADERS, "authorization": f"Bearer {key}"})


def error_of(path: str, resp: httpx2.Response) -> dict[str, object]:
    """The error object, whichever family's shape (Anthropic's is {"type": "error", "error": {...}})."""
    error = resp.json()["error"]
    assert isinstance(error, dict)
    if path.startswith("/anthropic"):
        assert resp.json()["type"] == "error"
    return error


@pytest.fixture
def gate(start_gate: Callable[..., RunningChatgate]) -> RunningChatgate:
    return start_gate()


@pytest.mark.parametrize(("path", "head"), ROUTES)
@pytest.mark.parametrize(("extra", "code"), [
    (b',"max_tokens":99999999,"max_tokens":10', "duplicate_key"),
    (b',"stream":false,"stream":true', "duplicate_key"),
    (b',"x":1e400', "invalid_json"),
    (b',"x":-1E+0400', "invalid_json"),
    (b',"x":' + b"9" * 400, "invalid_json"),
    (b',"x":1' + b"0" * 300 + b"e9", "invalid_json"),  # a one-digit exponent, a long mantissa
    (b',"x":' + b"9" * 210 + b"e+99", "invalid_json"),
    (b',"x":NaN', "invalid_json"),
    (b',"x":Infinity', "invalid_json"),
    (b',"x":' + b"[" * 129 + b"]" * 129, "nesting_too_deep"),
    (b',"x":' + b"[" * 300 + b"]" * 300, "nesting_too_deep"),
])
def test_a_body_deepseek_refuses_as_json_is_refused_here(
        gate: RunningChatgate, fake: RunningFake, tmp_path: Path, path: str, head: bytes, extra: bytes,
        code: str) -> None:
    resp = post(gate, path, head + extra + b"}")
    assert resp.status_code == 400, resp.text
    error = error_of(path, resp)
    assert error["code"] == code, error
    assert fake.state.requests == [], "nothing reached DeepSeek"
    assert usage_rows(tmp_path, 1)[0]["rule_code"] == code


@pytest.mark.parametrize(("path", "head"), ROUTES)
def test_the_dry_run_refuses_them_too(gate: RunningChatgate, path: str, head: bytes) -> None:
    resp = post(gate, path + "/validate", head + b',"max_tokens":1,"max_tokens":2}')
    assert resp.status_code == 400 and error_of(path, resp)["code"] == "duplicate_key", resp.text


def test_a_nul_in_model_is_refused(gate: RunningChatgate, fake: RunningFake) -> None:
    resp = post(gate, "/v1/chat/completions", b'{"model":"deepseek-flash\\u0000","messages":[{"role":"user",'
                                               b'"content":"hi"}]}')
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_model", resp.text
    assert fake.state.requests == []


@pytest.mark.parametrize("extra", [
    b',"x":' + b"[" * (127) + b"]" * (127),  # 128 levels with the body itself
    b',"x":1.7e308,"y":1e-400,"z":-0.0,"w":123456789012345678901234567890',
    b',"x":' + b"9" * 209 + b'e99,"y":1' + b"0" * 300 + b'e-9,"z":"e100 E+999 2e-400"',
    b',"x":"1e400 NaN Infinity","y":{"a":1},"z":{"a":2}',  # in strings; the same key in two objects
])
def test_what_deepseek_reads_is_forwarded_as_sent(gate: RunningChatgate, fake: RunningFake, extra: bytes
                                                  ) -> None:
    body = CHAT + extra + b"}"
    resp = post(gate, "/v1/chat/completions", body)
    assert resp.status_code == 200, resp.text
    assert fake.state.requests[-1].body == body


def test_the_depth_count_is_the_containers_count() -> None:
    from chatgate.gateway.strict import body_problem, too_deep
    assert not too_deep(orjson.loads(b"[" * 128 + b"]" * 128))
    assert too_deep(orjson.loads(b"[" * 129 + b"]" * 129))
    assert not too_deep({"a": [{"b": [1, 2, {"c": "x"}]}] * 500})
    assert body_problem(orjson.dumps({"a": [[1]] * 1000})) is None, "many brackets, none deep"


# -------------------------------------------------------------------------- the file-owner check, closed


@pytest.fixture
def teams(tmp_path: Path, fake: RunningFake) -> Iterator[Teams]:
    with start_teams(tmp_path, fake, SQLiteStore(tmp_path / "usage.db")) as started:
        yield started


@pytest.mark.parametrize("number", [b"1e400", b"NaN", b"-Infinity", b"1" + b"0" * 400])
def test_a_non_finite_number_does_not_hide_another_teams_file(teams: Teams, fake: RunningFake,
                                                              number: bytes) -> None:
    theirs = teams.upload("b1")
    part = b'{"type":"file","file":{"file_id":"' + theirs.encode() + b'"}}'
    body = (b'{"x":' + number + b',"model":"deepseek-flash","messages":[{"role":"user","content":['
            + part + b"]}]}")
    before = len(fake.state.requests)
    resp = post(teams.gate, "/v1/chat/completions", body, teams.keys["a1"][1])
    assert resp.status_code in (400, 404), resp.text
    assert len(fake.state.requests) == before, "another team's file never reaches DeepSeek"


def test_with_validation_off_an_unreadable_body_naming_a_file_is_refused(
        tmp_path: Path, fake: RunningFake) -> None:
    from tests.files.test_files import ADMIN, UPSTREAM
    from tests.harness import make_settings, run_chatgate
    store = SQLiteStore(tmp_path / "usage.db")
    settings = make_settings(tmp_path, fake.url, validation={"enabled": False}, auth={
        "mode": "managed", "upstream_api_key": UPSTREAM, "admin_key": ADMIN, "key_cache_seconds": 0})
    with run_chatgate(settings, store=store) as gate:
        teams = Teams(gate, store)
        theirs = teams.upload("b1")
        before = len(fake.state.requests)
        body = (b'{"x":NaN,"model":"deepseek-flash","messages":[{"role":"user","content":[{"type":"file",'
                b'"file_id":"' + theirs.encode() + b'"}]}]}')
        for number in (b"NaN", b"1e400"):  # read as they are: the owner check sees the file
            resp = post(gate, "/v1/chat/completions", body.replace(b"NaN", number), teams.keys["a1"][1])
            assert resp.status_code == 404, resp.text
        resp = post(gate, "/v1/chat/completions", body[:-3], teams.keys["a1"][1])  # cut short: unreadable
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json", resp.text
        assert len(fake.state.requests) == before


def test_the_check_returns_r1s_parse_with_its_verdict_and_keeps_nothing() -> None:
    """R1's parse is handed to the family's check and back to the caller as a value: a refused body's check
    returns none, a valid one's returns the body's parse (its keys in the body's order); `chatgate.wire` holds
    no state between calls (a checker process kept a 19 MB body's 150 MB until the next, once)."""
    import threading

    from chatgate import wire
    from chatgate.anthropic.family import count_text
    from chatgate.gateway.checking import check_now
    from chatgate.gateway.endpoints import families
    from chatgate.settings import Settings
    from chatgate.web.count_tokens import _prompt_of
    chat = next(f for f in families(Settings()) if f.name == "openai-chat")
    duplicate = check_now(chat, CHAT + b',"max_tokens":1,"max_tokens":2}', False, None)
    assert duplicate.parse is None and duplicate.verdict.problems[0].code == "duplicate_key"
    assert check_now(chat, CHAT + b',"messages":7}', False, None).verdict.problems
    body = CHAT + b"}"
    checked = check_now(chat, body, False, None)
    assert checked.verdict.problems == [] and checked.parse == orjson.loads(body)
    assert _prompt_of(count_text, ANTHROPIC + b"}", 1 << 20).startswith("user")
    assert not any(isinstance(v, threading.local) for v in vars(wire).values())
