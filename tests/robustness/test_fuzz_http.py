"""HTTP fuzzing: raw request bodies and headers thrown at a real chatgate (uvicorn on loopback) whose upstream
is the fake DeepSeek (no faults configured).

Invariants checked on every single response:
- chatgate never answers 5xx (the fake has no faults, so no 5xx can legitimately come from upstream);
- every 4xx body has the OpenAI error shape {"error": {"message", "type", "param", "code"}};
- no request hangs (client timeout), and /healthz still answers afterwards.

Budget: CHATGATE_FUZZ_REQUESTS (default 2000) requests spread over the strategies below; set it to 10000+
for a long run. CHATGATE_FUZZ_REPORT=path writes the figures (requests, status histogram, duration) as JSON.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx2
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes import server as fake_server
from tests.harness import RunningChatgate, make_settings, run_chatgate

pytestmark = pytest.mark.slow  # fuzzing a running server

BUDGET = int(os.environ.get("CHATGATE_FUZZ_REQUESTS", "2000"))
MAX_BODY = 8 * 1024 * 1024  # limits.max_body_bytes of the chatgate under test
CHAT = "/v1/chat/completions"
KEY = "Bearer sk-fuzz-0001"
JSON_HEADERS = {"content-type": "application/json", "authorization": KEY}

STATS: Counter[int] = Counter()
SENT = [0]


def share(fraction: float) -> int:
    return max(10, int(BUDGET * fraction))


def fuzz_settings(fraction: float) -> Any:
    return settings(max_examples=share(fraction), deadline=None, database=None, derandomize=False,
                    suppress_health_check=list(HealthCheck))


VALID_BODY: dict[str, Any] = {
    "model": "deepseek-chat",
    "messages": [
        {"role": "system", "content": "You are a terse assistant for a logistics team."},
        {"role": "user", "content": "Which of our three depots is closest to Lyon?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "depot_distance", "arguments": "{\"city\": \"Lyon\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"Grenoble\": 104, \"Dijon\": 192}"},
    ],
    "tools": [{"type": "function", "function": {
        "name": "depot_distance", "description": "km from each depot",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "temperature": 0.3,
    "top_p": 0.9,
    "max_tokens": 40,
    "stop": ["\n\n"],
    "response_format": {"type": "text"},
    "stream": False,
    "stream_options": None,
    "logprobs": False,
    "user": "fuzz",
}


# --- servers ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake() -> Iterator[fake_server.RunningFake]:
    with fake_server.run_fake_deepseek() as running:
        yield running


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory, fake: fake_server.RunningFake
         ) -> Iterator[RunningChatgate]:
    tmp = tmp_path_factory.mktemp("fuzz")
    started = time.monotonic()
    with run_chatgate(make_settings(tmp, fake.url, limits={"max_body_bytes": MAX_BODY})) as running:
        yield running
        assert not [r for r in fake.state.requests if (r.status or 0) >= 500], "the fake answered 5xx"
    figures = {"requests": SENT[0], "statuses": dict(sorted(STATS.items())),
               "server_errors": sum(n for s, n in STATS.items() if s >= 500),
               "duration_s": round(time.monotonic() - started, 1)}
    print("\nfuzz figures:", json.dumps(figures))
    if os.environ.get("CHATGATE_FUZZ_REPORT"):
        with open(os.environ["CHATGATE_FUZZ_REPORT"], "w") as f:
            json.dump(figures, f)


@pytest.fixture(scope="module")
def client(gate: RunningChatgate) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=gate.url, timeout=httpx2.Timeout(30.0)) as c:
        yield c


def send(client: httpx2.Client, method: str, path: str, content: Any = None,
         headers: dict[str, str] | None = None) -> httpx2.Response:
    """One request; checks the invariants every response must hold."""
    try:
        raw = {k: v.encode("latin-1") for k, v in (headers or {}).items()}  # bytes: non-ASCII values go as is
        resp = client.request(method, path, content=content, headers=raw)
    except httpx2.TimeoutException:  # pragma: no cover - a hang is the failure
        pytest.fail(f"chatgate did not answer {method} {path} within the client timeout")
    SENT[0] += 1
    STATS[resp.status_code] += 1
    assert resp.status_code < 500, f"chatgate answered {resp.status_code}: {resp.text[:500]}"
    if 400 <= resp.status_code < 500:
        assert_openai_error(resp)
    return resp


def assert_openai_error(resp: httpx2.Response) -> None:
    try:
        data = resp.json()
    except ValueError:
        pytest.fail(f"{resp.status_code} body is not JSON: {resp.text[:300]!r}")
    assert isinstance(data, dict) and isinstance(data.get("error"), dict), data
    error = data["error"]
    assert {"message", "type", "param", "code"} <= error.keys(), error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str), error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], (str, int)), error


def assert_alive(gate: RunningChatgate) -> None:
    """A fresh connection still gets /healthz: nothing is wedged."""
    resp = httpx2.get(gate.url + "/healthz", timeout=10)
    assert resp.status_code == 200 and resp.json()["status"] == "ok"


# --- strategies ------------------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths_of(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths_of(item, (*prefix, index))


ALL_PATHS = [p for p in paths_of(VALID_BODY) if p]


def set_at(doc: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> Any:
    doc = copy.deepcopy(doc)
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@st.composite
def mutated_bodies(draw: st.DrawFn) -> bytes:
    """The valid body with one to three random paths replaced by random JSON (or deleted, or an extra key)."""
    doc: Any = VALID_BODY
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in paths_of(doc) if p]
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "replace", "delete", "add_key"]))
        if action == "add_key":
            parent_path = path[:-1]
            parent = doc
            for step in parent_path:
                parent = parent[step]
            if isinstance(parent, dict):
                doc = set_at(doc, (*parent_path, draw(st.text(max_size=12))), draw(json_values))
                continue
        doc = set_at(doc, path, draw(json_values), delete=action == "delete")
    if draw(st.booleans()):
        doc = set_at(doc, ("stream",), draw(st.sampled_from([True, False])))
    return json.dumps(doc).encode()


@st.composite
def malformed_json(draw: st.DrawFn) -> bytes:
    valid = orjson.dumps(VALID_BODY)
    kind = draw(st.sampled_from(["truncate", "splice", "garbage", "top_level", "duplicate", "numbers"]))
    if kind == "truncate":
        return valid[: draw(st.integers(0, len(valid) - 1))]
    if kind == "splice":
        at = draw(st.integers(0, len(valid)))
        return valid[:at] + draw(st.binary(min_size=1, max_size=8)) + valid[at:]
    if kind == "garbage":
        return draw(st.binary(max_size=300))
    if kind == "top_level":
        return json.dumps(draw(json_values.filter(lambda v: not isinstance(v, dict)))).encode()
    if kind == "duplicate":
        return valid[:-1] + b',"model":' + json.dumps(draw(json_values)).encode() + b"}"
    token = draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999999", b"-0", b"01", b"1.",
                                  b"0x10", b"99999999999999999999999999999999"]))
    return valid.replace(b'"max_tokens":40', b'"max_tokens":' + token)


@st.composite
def bad_encodings(draw: st.DrawFn) -> bytes:
    """Invalid UTF-8 inside strings, lone/mismatched surrogate escapes, BOMs, UTF-16 bodies, NUL bytes."""
    content = draw(st.sampled_from([
        b"\xff\xfe", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xc0\xaf",
        b"\\ud800", b"\\udfff", b"\\ud800\\u0041", b"\\udc00\\ud800", b"\\u0000", b"\x00", b"\\uZZZZ",
        b"\\u12",
    ]))
    where = draw(st.sampled_from(["content", "model", "key", "role"]))
    text = b"before " + content + b" after"
    if where == "content":
        body = b'{"model":"deepseek-chat","messages":[{"role":"user","content":"' + text + b'"}]}'
    elif where == "model":
        body = b'{"model":"' + text + b'","messages":[{"role":"user","content":"hi"}]}'
    elif where == "key":
        body = b'{"model":"deepseek-chat","' + text + b'":1,"messages":[{"role":"user","content":"hi"}]}'
    else:
        body = b'{"model":"deepseek-chat","messages":[{"role":"' + text + b'","content":"hi"}]}'
    wrap = draw(st.sampled_from(["none", "bom", "utf16"]))
    if wrap == "bom":
        return b"\xef\xbb\xbf" + body
    if wrap == "utf16":
        return body.decode("latin-1").encode("utf-16")
    return body


content_types = st.sampled_from([
    None, "", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
    "application/json; charset=latin-1", "APPLICATION/JSON", "application/vnd.api+json", "application/jsonx",
    "application/json;;;", "json", "*/*", "application/json, text/plain", "application/\u00e9json",
])

token_chars = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
RESERVED = {"host", "content-length", "transfer-encoding", "connection", "content-type", "expect", "upgrade",
            "te", "trailer", "keep-alive", "proxy-connection"}
header_names = st.text(token_chars, min_size=1, max_size=30).filter(
    lambda n: n.lower() not in RESERVED and not n.lower().startswith("x-fake"))
# Full latin-1, obs-text (0x80-0xFF) included: found a 500 once (header values re-encoded as ASCII upstream).
header_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
                        max_size=200).map(str.strip)


# --- tests -----------------------------------------------------------------------------------------


def test_valid_body_is_answered_200(client: httpx2.Client) -> None:
    """Sanity: the fuzz base body is valid and goes through, so mutations start from an accepted request."""
    resp = send(client, "POST", CHAT, orjson.dumps(VALID_BODY), JSON_HEADERS)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["role"] == "assistant"


def test_wrong_types_at_every_depth(gate: RunningChatgate, client: httpx2.Client) -> None:
    """Any field at any depth replaced/deleted/extended with random JSON: a 200 or an OpenAI-shaped 4xx."""
    @fuzz_settings(0.40)
    @given(body=mutated_bodies(),
           route=st.sampled_from([CHAT, CHAT, "/beta/chat/completions", CHAT + "/validate"]))
    def run(body: bytes, route: str) -> None:
        resp = send(client, "POST", route, body, JSON_HEADERS)
        assert resp.status_code in (200, 400, 401, 413, 422), resp.text[:300]
    run()
    assert_alive(gate)


def test_every_path_of_the_valid_body_with_every_kind_of_wrong_type(gate: RunningChatgate,
                                                                     client: httpx2.Client) -> None:
    """Exhaustive, not random: each path of the base body set to each JSON type in turn (type checks)."""
    kinds: list[Any] = [None, True, -1, 2**64, 1.5, "", "x" * 300, [], [None], {}, {"": None}]
    for path in ALL_PATHS:
        for value in kinds:
            send(client, "POST", CHAT, json.dumps(set_at(VALID_BODY, path, value)).encode(), JSON_HEADERS)
    assert_alive(gate)


def test_malformed_json(gate: RunningChatgate, client: httpx2.Client) -> None:
    """Truncated, spliced, garbage, non-object, duplicate keys, out-of-range numbers: 400, never 5xx."""
    @fuzz_settings(0.15)
    @given(body=malformed_json())
    def run(body: bytes) -> None:
        send(client, "POST", CHAT, body, JSON_HEADERS)
    run()
    assert_alive(gate)


def test_invalid_utf8_and_lone_surrogates(gate: RunningChatgate, client: httpx2.Client) -> None:
    @fuzz_settings(0.08)
    @given(body=bad_encodings())
    def run(body: bytes) -> None:
        send(client, "POST", CHAT, body, JSON_HEADERS)
    run()
    assert_alive(gate)


def test_wrong_or_missing_content_type(gate: RunningChatgate, client: httpx2.Client) -> None:
    """Anything but application/json (or +json) is a 415 in the OpenAI shape, whatever the body."""
    @fuzz_settings(0.08)
    @given(ctype=content_types, body=st.sampled_from([orjson.dumps(VALID_BODY), b"", b"a=b", b"\xff"]))
    def run(ctype: str | None, body: bytes) -> None:
        headers = {"authorization": KEY}
        if ctype is not None:
            headers["content-type"] = ctype
        send(client, "POST", CHAT, body, headers)
    run()
    assert_alive(gate)


def test_random_headers(gate: RunningChatgate, client: httpx2.Client) -> None:
    """Random extra headers (including random Authorization / x-request-id values) never break a request."""
    @fuzz_settings(0.14)
    @given(extra=st.dictionaries(header_names | st.sampled_from(["authorization", "x-request-id", "accept",
                                                                  "accept-encoding", "cookie", "user-agent"]),
                                 header_values, max_size=8),
           body=st.sampled_from([orjson.dumps(VALID_BODY), b"{}", b"[", b""]))
    def run(extra: dict[str, str], body: bytes) -> None:
        send(client, "POST", CHAT, body, {**JSON_HEADERS, **extra})
    run()
    assert_alive(gate)


UTF8_CAFE = "caf\u00e9".encode().decode("latin-1")  # send() encodes values as latin-1: these are UTF-8 bytes


@pytest.mark.parametrize(("name", "value", "arrives"), [
    ("x-team-label", UTF8_CAFE, UTF8_CAFE),
    # Not valid UTF-8: aiohttp writes header values as UTF-8, so obs-text arrives as its latin-1 reading.
    ("x-team-label", "caf\u00e9", UTF8_CAFE),
    ("x-request-id", "caf\u00e9", None),
], ids=["utf8-value", "latin1-obs-text", "request-id"])
def test_non_ascii_header_value_is_forwarded(client: httpx2.Client, fake: fake_server.RunningFake,
                                             name: str, value: str, arrives: str | None) -> None:
    """HTTP allows obs-text (0x80-0xFF) in header values; a valid request carrying one is forwarded, not a
    500. UTF-8 values arrive byte for byte; a non-ASCII x-request-id is replaced by a generated one."""
    body = orjson.dumps(VALID_BODY)
    before = len(fake.state.requests)
    resp = send(client, "POST", CHAT, body, {**JSON_HEADERS, name: value})
    assert resp.status_code == 200
    fake.state.wait_idle(5)
    (forwarded,) = fake.state.requests[before:]
    assert forwarded.body == body
    if arrives is not None:
        assert forwarded.headers[name] == arrives  # the fake reads header bytes as latin-1
    else:
        assert forwarded.request_id == resp.headers["x-request-id"] and forwarded.request_id.isascii()


def test_random_methods_and_paths(gate: RunningChatgate, client: httpx2.Client) -> None:
    """Unknown routes and wrong methods: OpenAI-shaped 404/405, never 5xx."""
    @fuzz_settings(0.05)
    @given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
           path=st.sampled_from([CHAT, "/v1/models", "/beta/chat/completions", "/admin/usage",
                                 "/v1/completions", "/v1/chat/completions/validate", "/"])
           | st.text(token_chars + "/", max_size=40).map(lambda p: "/" + p))
    def run(method: str, path: str) -> None:
        send(client, method, path, b"{}" if method in ("POST", "PUT", "PATCH") else None, JSON_HEADERS)
    run()
    assert_alive(gate)


@pytest.mark.parametrize("depth", [100, 1000, 1025, 10_000])
@pytest.mark.parametrize("opener,closer", [(b"[", b"]"), (b'{"a":', b"}")])
def test_deep_nesting(gate: RunningChatgate, client: httpx2.Client, depth: int, opener: bytes,
                      closer: bytes) -> None:
    """Nesting up to 10,000 levels, at the top and inside fields the validator walks: never a 5xx; beyond
    the JSON parser's depth limit (1024) always a 400. (Moderate nesting in unknown fields may pass.)"""
    nested = opener * depth + b"1" + closer * depth
    top = send(client, "POST", CHAT, nested, JSON_HEADERS)
    assert top.status_code == 400
    for field in (b"response_format", b"tools", b"metadata", b"stop"):
        body = b'{"model":"deepseek-chat","messages":[{"role":"user","content":"hi"}],"%s":%s}' % (
            field, nested)
        resp = send(client, "POST", CHAT, body, JSON_HEADERS)
        if depth > 1024:
            assert resp.status_code == 400, resp.text[:300]
    content = b'{"model":"deepseek-chat","messages":[{"role":"user","content":' + nested + b"}]}"
    assert send(client, "POST", CHAT, content, JSON_HEADERS).status_code == 400
    assert_alive(gate)


@pytest.mark.parametrize("size_mb", [1, 3, 6])
def test_huge_strings(gate: RunningChatgate, client: httpx2.Client, size_mb: int) -> None:
    """Several-MB strings in content, model, a tool name and an unknown key: answered (not hung), no 5xx."""
    big = "a" * (size_mb * 1024 * 1024 - 1024)
    bodies = [
        {"model": "deepseek-chat", "messages": [{"role": "user", "content": big}], "max_tokens": 5},
        {"model": big, "messages": [{"role": "user", "content": "hi"}]},
        {"model": "deepseek-chat", "messages": [{"role": "user", "content": "hi"}],
         "tools": [{"type": "function", "function": {"name": big}}]},
        {"model": "deepseek-chat", "messages": [{"role": "user", "content": "hi"}], big: 1},
        {"model": "deepseek-chat", "messages": [{"role": "user", "content": "hi"}], "stop": big},
    ]
    for body in bodies:
        send(client, "POST", CHAT, orjson.dumps(body), JSON_HEADERS)
    assert_alive(gate)


def test_oversize_bodies_are_413(gate: RunningChatgate, client: httpx2.Client) -> None:
    """Bodies over limits.max_body_bytes: 413 naming the limit, valid JSON or not."""
    for body in (b"{" + b" " * MAX_BODY + b"}",
                 orjson.dumps({"model": "deepseek-chat",
                               "messages": [{"role": "user", "content": "x" * MAX_BODY}]})):
        resp = send(client, "POST", CHAT, body, JSON_HEADERS)
        assert resp.status_code == 413
        assert resp.json()["error"]["code"] == "request_too_large"
        assert str(MAX_BODY) in resp.json()["error"]["message"]
    assert_alive(gate)


def test_the_fuzz_budget_was_spent_without_a_server_error(gate: RunningChatgate) -> None:
    """Runs last in this module (pytest keeps file order): the properties above really sent their share of
    CHATGATE_FUZZ_REQUESTS (hypothesis may stop a property early only when it runs out of distinct cases),
    and no request got a 5xx."""
    assert SENT[0] >= BUDGET * 0.9 * 0.6, f"only {SENT[0]} requests for a budget of {BUDGET}"
    assert sum(n for status, n in STATS.items() if status >= 500) == 0
    assert STATS[200] > 0 and STATS[400] > 0, STATS
