"""The HTTP surface of chatgate, with an `httpx2.MockTransport` standing in for DeepSeek.

Each test runs the real app under uvicorn on loopback and talks to it over HTTP; the mock upstream records
exactly what chatgate forwarded (path, headers, body bytes).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson
import pytest

from chatgate.gateway.auth import new_key
from tests.gateway.conftest import JSON_HEADERS, chat_body
from tests.harness import RunningChatgate, make_settings, run_chatgate

COMPLETION = {
    "id": "c0ffee", "object": "chat.completion", "created": 1, "model": "deepseek-flash",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14, "prompt_cache_hit_tokens": 0,
              "prompt_cache_miss_tokens": 12},
}  # fmt: skip
UPSTREAM_MODELS = {"object": "list", "data": [{"id": "deepseek-upstream-only", "object": "model",
                                               "owned_by": "deepseek"}]}


@dataclass
class MockUpstream:
    """Records what reaches "DeepSeek" and answers with a canned completion (or model list)."""

    seen: list[httpx2.Request] = field(default_factory=list)
    unreachable: bool = False
    extra_response_headers: dict[str, str] = field(default_factory=dict)

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        if self.unreachable:
            raise httpx2.ConnectError("connection refused", request=request)
        self.seen.append(request)
        payload = UPSTREAM_MODELS if request.url.path.endswith("/models") else COMPLETION
        headers = {"x-ds-trace-id": "trace-1", **self.extra_response_headers}
        return httpx2.Response(200, content=orjson.dumps(payload), headers=headers,
                               extensions={"http_version": b"HTTP/1.1"})

    @property
    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self.handler)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningChatgate, MockUpstream]]:
    """One chatgate + mock upstream for the module (most tests only read what reached the mock)."""
    mock = MockUpstream()
    settings = make_settings(tmp_path_factory.mktemp("routes"), "http://deepseek.invalid",
                             upstream={"models_cache_seconds": 0})
    with run_chatgate(settings, transport=mock.transport) as gate:
        yield gate, mock


@pytest.fixture
def upstream(shared: tuple[RunningChatgate, MockUpstream]) -> MockUpstream:
    mock = shared[1]
    mock.seen.clear()
    mock.unreachable = False
    mock.extra_response_headers = {}
    return mock


@pytest.fixture
def client(shared: tuple[RunningChatgate, MockUpstream], upstream: MockUpstream) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=shared[0].url, timeout=10) as http:
        yield http


@pytest.fixture
def own_upstream() -> MockUpstream:
    """A mock for tests that start their own chatgate (special settings)."""
    return MockUpstream()


def post_chat(client: httpx2.Client, path: str = "/v1/chat/completions", body: bytes | None = None,
              headers: dict[str, str] | None = None) -> httpx2.Response:
    content = body if body is not None else orjson.dumps(chat_body())
    return client.post(path, content=content, headers={**JSON_HEADERS, **(headers or {})})


def assert_openai_error(response: httpx2.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert {"message", "type", "param", "code"} <= set(error)
    if code is not None:
        assert error["code"] == code
    return dict(error)


# ------------------------------------------------------------------------------------------- chat routes


@pytest.mark.parametrize(("path", "upstream_path"), [
    ("/v1/chat/completions", "/chat/completions"),
    ("/chat/completions", "/chat/completions"),
    ("/beta/chat/completions", "/beta/chat/completions"),
])  # fmt: skip
def test_chat_route_is_forwarded_to_the_matching_upstream_path(
        client: httpx2.Client, upstream: MockUpstream, path: str, upstream_path: str) -> None:
    response = post_chat(client, path)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Paris."
    assert [(r.method, r.url.path) for r in upstream.seen] == [("POST", upstream_path)]


def test_body_reaches_upstream_byte_for_byte(client: httpx2.Client, upstream: MockUpstream) -> None:
    """R39: unknown fields kept; whitespace, key order and escapes untouched (no re-serialisation)."""
    body = (b'{ "messages" : [ {"content":"Caf\\u00e9 \xc3\xa9 \\"quoted\\"\\n",  "role":"user"} ],\n'
            b'\t"x_vendor_field": {"z": 1, "a": [true, null, 1.50]},  "model":"deepseek-flash",'
            b'"temperature": 0.70 }')
    response = post_chat(client, body=body)
    assert response.status_code == 200, response.text
    assert len(upstream.seen) == 1
    assert upstream.seen[0].content == body


def test_beta_route_accepts_prefix_completion(client: httpx2.Client, upstream: MockUpstream) -> None:
    """R21: `prefix: true` on the last assistant message is valid on /beta and forwarded there."""
    body = chat_body(messages=[{"role": "user", "content": "Write a haiku about the sea"},
                               {"role": "assistant", "content": "Waves", "prefix": True}])
    response = post_chat(client, "/beta/chat/completions", orjson.dumps(body))
    assert response.status_code == 200, response.text
    assert [r.url.path for r in upstream.seen] == ["/beta/chat/completions"]


def test_prefix_completion_outside_beta_is_rejected_locally(client: httpx2.Client,
                                                            upstream: MockUpstream) -> None:
    """R21: the same payload on /v1/chat/completions is a local 400, nothing forwarded."""
    body = chat_body(messages=[{"role": "user", "content": "Write a haiku about the sea"},
                               {"role": "assistant", "content": "Waves", "prefix": True}])
    error = assert_openai_error(post_chat(client, body=orjson.dumps(body)), 400, "invalid_prefix")
    assert error["param"] == "messages[1].prefix"
    assert upstream.seen == []


def test_invalid_request_is_answered_locally_with_all_problems(client: httpx2.Client,
                                                               upstream: MockUpstream) -> None:
    """R25 + R38: two problems, the first in `message`, all in `error.problems`; nothing forwarded."""
    body = orjson.dumps(chat_body(temperature=3, n=2, thinking={"type": "disabled"}))
    error = assert_openai_error(post_chat(client, body=body), 400)
    assert error["type"] == "invalid_request_error"
    codes = {p["code"] for p in error["problems"]}
    assert {"out_of_range", "n_not_supported"} <= codes
    assert error["code"] == error["problems"][0]["code"]
    assert upstream.seen == []


# ------------------------------------------------------------------------------------------- validate


@pytest.mark.parametrize("path", ["/v1/chat/completions/validate", "/chat/completions/validate"])
def test_validate_endpoint_accepts_a_valid_request_without_forwarding(
        client: httpx2.Client, upstream: MockUpstream, path: str) -> None:
    response = post_chat(client, path)
    assert response.status_code == 200
    assert response.json()["valid"] is True
    assert upstream.seen == []


def test_validate_endpoint_returns_the_400_without_forwarding(client: httpx2.Client,
                                                              upstream: MockUpstream) -> None:
    """R16: a tool result that answers no tool call, reported with its exact param."""
    body = chat_body(messages=[
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ])
    error = assert_openai_error(post_chat(client, "/v1/chat/completions/validate", orjson.dumps(body)), 400)
    assert error["param"] is not None and error["param"].startswith("messages[1]")
    assert upstream.seen == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/chat/completions/validate"])
def test_a_model_deepseek_does_not_serve_is_refused_with_the_one_to_use(
        client: httpx2.Client, upstream: MockUpstream, path: str) -> None:
    """Issue 50 item 7: DeepSeek would answer "Model Not Exist" with param null; chatgate names the model."""
    error = assert_openai_error(post_chat(client, path, orjson.dumps(chat_body(model="gpt-4o"))), 400)
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "did you mean 'deepseek-flash'" in error["message"] and error["problems"][0]["rule"] == "R3"
    assert upstream.seen == []


STRICT_TOOL = {"type": "function", "function": {
    "name": "lookup", "strict": True,
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"],
                   "additionalProperties": False}}}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/chat/completions"])
def test_strict_tools_off_beta_are_forwarded_byte_for_byte_with_a_warning(
        client: httpx2.Client, upstream: MockUpstream, path: str) -> None:
    """R32 (issue 11): what openai-agents and pydantic-ai send on DeepSeek's default base URL."""
    body = orjson.dumps(chat_body(tools=[STRICT_TOOL]))
    response = post_chat(client, path, body)
    assert response.status_code == 200, response.text
    assert upstream.seen[0].content == body
    warning = response.headers["x-chatgate-warning"]
    assert "only enforced on DeepSeek's /beta" in warning
    assert "chatgate: " + str(client.base_url).rstrip("/") + "/beta" in warning


def test_validate_lists_warnings_with_the_address_the_request_came_to(client: httpx2.Client,
                                                                     upstream: MockUpstream) -> None:
    body = orjson.dumps(chat_body(tools=[STRICT_TOOL], thinking={"type": "disabled"},
                                  reasoning_effort="high"))
    response = client.post("/v1/chat/completions/validate", content=body,
                           headers={**JSON_HEADERS, "host": "gate.example:9443"})
    assert response.status_code == 200
    answer = response.json()
    warnings = answer["warnings"]
    assert [(w["code"], w["param"], w["rule"]) for w in warnings] == [
        ("strict_not_enforced", "tools[0].function.strict", "R32")]
    assert "http://gate.example:9443/beta" in warnings[0]["message"]
    assert "8787" not in warnings[0]["message"]
    # R41 (thinking disabled + effort) is repaired by default (thinking_conflict, lossless)
    assert [(r["code"], r["path"]) for r in answer["repairs"]] == [("thinking_conflict", "reasoning_effort")]
    assert "reasoning_effort" not in answer["repaired_body"]
    assert upstream.seen == []


def test_strict_mode_refuses_strict_tools_off_beta_naming_the_clients_address(
        start_gate: Callable[..., RunningChatgate], own_upstream: MockUpstream) -> None:
    gate = start_gate(upstream_url="http://deepseek.invalid", transport=own_upstream.transport,
                      validation={"strict": True})
    with httpx2.Client(base_url=gate.url, timeout=10) as http:
        error = assert_openai_error(post_chat(http, body=orjson.dumps(chat_body(tools=[STRICT_TOOL]))), 400,
                                    "strict_requires_beta")
        assert f"{gate.url}/beta" in error["message"]
        assert post_chat(http, "/beta/chat/completions",
                         orjson.dumps(chat_body(tools=[STRICT_TOOL]))).status_code == 200
    assert [r.url.path for r in own_upstream.seen] == ["/beta/chat/completions"]


# ------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("body", [
    pytest.param(b'{"model": "deepseek-flash", "messages": [', id="truncated-json"),
    pytest.param(b"", id="empty"),
    pytest.param(b"[1, 2, 3]", id="array-not-object"),
    pytest.param(b'"just a string"', id="string-not-object"),
    pytest.param(b"null", id="null"),
    pytest.param(b'{"model": 42, "messages": "hello"}', id="wrong-types"),
    pytest.param(b'{"model": "deepseek-flash", "messages": [{"role": "user", "content": 5}]}',
                 id="content-int"),
    pytest.param(b'{"model": "deepseek-flash", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
                 id="not-utf8"),
    pytest.param(b'{"model": "deepseek-flash", "messages": []}', id="empty-messages"),
    pytest.param(b'{"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}], '
                 b'"stream": "yes"}',
                 id="stream-string"),
    pytest.param(b"[" * 5000 + b"]" * 5000, id="deep-nesting"),
])  # fmt: skip
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/chat/completions/validate"])
def test_malformed_body_is_a_400_never_422_or_500(client: httpx2.Client, upstream: MockUpstream,
                                                 body: bytes, path: str) -> None:
    response = post_chat(client, path, body)
    assert_openai_error(response, 400)
    assert upstream.seen == []
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_non_json_content_type_is_415(client: httpx2.Client, upstream: MockUpstream,
                                      content_type: str) -> None:
    response = post_chat(client, headers={"content-type": content_type})
    assert_openai_error(response, 415, "unsupported_media_type")
    assert upstream.seen == []


def test_json_content_type_with_charset_is_accepted(client: httpx2.Client) -> None:
    response = post_chat(client, headers={"content-type": "application/json; charset=utf-8"})
    assert response.status_code == 200


@pytest.fixture
def small_limit(start_gate: Callable[..., RunningChatgate], own_upstream: MockUpstream
                ) -> Iterator[httpx2.Client]:
    gate = start_gate(upstream_url="http://deepseek.invalid", transport=own_upstream.transport,
                      limits={"max_body_bytes": 2048})
    with httpx2.Client(base_url=gate.url, timeout=10) as http:
        yield http


def test_oversize_body_is_413(small_limit: httpx2.Client, own_upstream: MockUpstream) -> None:
    body = orjson.dumps(chat_body("x" * 4096))
    assert_openai_error(post_chat(small_limit, body=body), 413, "request_too_large")
    assert own_upstream.seen == []


def test_oversize_chunked_body_without_length_is_413(small_limit: httpx2.Client,
                                                     own_upstream: MockUpstream) -> None:
    """No content-length to trust: the limit is enforced while reading the stream."""
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "deepseek-flash", "messages": [{"role": "user", "content": "'
        for _ in range(8):
            yield b"y" * 512
        yield b'"}]}'
    response = small_limit.post("/v1/chat/completions", content=chunks(), headers=JSON_HEADERS)
    assert_openai_error(response, 413, "request_too_large")
    assert own_upstream.seen == []


@pytest.mark.slow  # two 48 MiB bodies (the small_limit tests check the limit in the quick loop)
def test_default_body_limit_is_deepseeks_48_mib(start_gate: Callable[..., RunningChatgate],
                                               own_upstream: MockUpstream) -> None:
    """docs/rules-chat.md (R9, U12): DeepSeek refuses bodies over 48 MiB, so chatgate answers 413 and uploads
    nothing."""
    gate = start_gate(upstream_url="http://deepseek.invalid", transport=own_upstream.transport)
    assert gate.state.settings.limits.max_body_bytes == 48 * 1024 * 1024
    prefix = b'{"model": "deepseek-flash", "messages": [{"role": "user", "content": "'
    suffix = b'"}]}'
    with httpx2.Client(base_url=gate.url, timeout=60) as http:
        just_over = prefix + b"z" * (48 * 1024 * 1024 + 1 - len(prefix) - len(suffix)) + suffix
        assert_openai_error(post_chat(http, body=just_over), 413, "request_too_large")
        at_limit = just_over[:len(prefix)] + just_over[len(prefix) + 1:]
        assert len(at_limit) == 48 * 1024 * 1024
        assert post_chat(http, body=at_limit).status_code == 200
    assert len(own_upstream.seen) == 1


def test_body_under_the_limit_is_forwarded(small_limit: httpx2.Client, own_upstream: MockUpstream) -> None:
    body = orjson.dumps(chat_body("y" * 1975))
    assert 2000 < len(body) <= 2048
    assert post_chat(small_limit, body=body).status_code == 200
    assert [r.content for r in own_upstream.seen] == [body]


# ------------------------------------------------------------------------------------------- other routes


@pytest.mark.parametrize("path", ["/v1/models", "/models"])
def test_models_are_forwarded(client: httpx2.Client, upstream: MockUpstream, path: str) -> None:
    response = client.get(path, headers={"authorization": "Bearer sk-test-client-0001"})
    assert response.status_code == 200
    assert response.json() == UPSTREAM_MODELS
    assert [(r.method, r.url.path) for r in upstream.seen] == [("GET", "/models")]
    assert upstream.seen[0].headers["authorization"] == "Bearer sk-test-client-0001"


def test_models_fall_back_to_configured_profiles_when_upstream_unreachable(
        client: httpx2.Client, upstream: MockUpstream) -> None:
    upstream.unreachable = True
    response = client.get("/v1/models", headers={"authorization": "Bearer sk-test-client-0001"})
    assert response.status_code == 200
    ids = {m["id"] for m in response.json()["data"]}
    assert {"deepseek-flash", "deepseek-chat"} <= ids
    assert all(m["object"] == "model" for m in response.json()["data"])


def test_healthz(client: httpx2.Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_an_unknown_path_under_a_familys_prefix_is_a_404_in_its_shape(client: httpx2.Client,
                                                                    upstream: MockUpstream) -> None:
    resp = client.get("/anthropic/v1/nothing-here")
    assert resp.status_code == 404, resp.text
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error", body
    assert body["error"]["code"] == "not_found" and resp.headers["request-id"] == body["request_id"]
    assert upstream.seen == []


def test_readyz_with_writable_store(client: httpx2.Client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.text
    assert response.json()["ready"] is True


def test_unknown_route_is_404_in_openai_shape(client: httpx2.Client, upstream: MockUpstream) -> None:
    error = assert_openai_error(client.post("/v1/completions", json={"prompt": "hi"}), 404, "not_found")
    assert "/v1/completions" in error["message"]
    other = assert_openai_error(client.get("/v2/anything"), 404, "not_found")
    assert upstream.seen == []
    # every route the message names is one chatgate serves, with and without /v1
    listed = other["message"].split("routes:")[1].split("(each")[0]
    named = re.findall(r"/[a-z0-9/_]+", listed)
    assert len(named) == 7
    for path in named:
        for served in {path, path.removeprefix("/v1")}:
            method = "GET" if served.endswith(("models", "balance", "files")) else "POST"
            assert client.request(method, served, json={}).status_code != 404, served


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/chat/completions"), ("PUT", "/chat/completions"), ("DELETE", "/v1/models"),
    ("GET", "/v1/chat/completions/validate"),
])  # fmt: skip
def test_wrong_method_is_405_in_openai_shape(client: httpx2.Client, upstream: MockUpstream, method: str,
                                             path: str) -> None:
    assert_openai_error(client.request(method, path), 405, "method_not_allowed")
    assert upstream.seen == []


# ------------------------------------------------------------------------------------------- headers


def test_client_request_id_is_honoured_upstream_and_returned(client: httpx2.Client,
                                                             upstream: MockUpstream) -> None:
    response = post_chat(client, headers={"x-request-id": "req-from-client-42"})
    assert response.headers["x-request-id"] == "req-from-client-42"
    assert upstream.seen[0].headers.get_list("x-request-id") == ["req-from-client-42"]


def test_request_id_is_generated_when_missing(client: httpx2.Client, upstream: MockUpstream) -> None:
    first, second = post_chat(client), post_chat(client)
    ids = [first.headers["x-request-id"], second.headers["x-request-id"]]
    assert all(len(i) >= 16 for i in ids) and ids[0] != ids[1]
    assert [r.headers["x-request-id"] for r in upstream.seen] == ids


def test_rejected_request_still_returns_its_request_id(client: httpx2.Client) -> None:
    response = post_chat(client, body=orjson.dumps(chat_body(n=3)), headers={"x-request-id": "rid-rejected"})
    assert response.status_code == 400
    assert response.headers["x-request-id"] == "rid-rejected"


def test_hop_by_hop_headers_are_not_forwarded(client: httpx2.Client, upstream: MockUpstream) -> None:
    headers = {
        "te": "trailers", "keep-alive": "timeout=5", "proxy-authorization": "Basic c2VjcmV0",
        "trailer": "x-checksum", "connection": "keep-alive, x-hop-secret", "x-hop-secret": "drop-me",
        "x-client-trace": "kept", "user-agent": "OpenAI/Python 3.57.0",
        # uvicorn answers the client's 100-continue itself: sent on, aiohttp would wait for DeepSeek's
        "expect": "100-continue", "proxy-connection": "keep-alive",
    }
    assert post_chat(client, headers=headers).status_code == 200
    sent = upstream.seen[0].headers
    for name in ("te", "keep-alive", "proxy-authorization", "trailer", "x-hop-secret", "expect",
                 "proxy-connection"):
        assert name not in sent, name
    assert sent["x-client-trace"] == "kept"
    assert sent["user-agent"] == "OpenAI/Python 3.57.0"
    assert sent["host"] == "deepseek.invalid"
    assert sent["content-length"] == str(len(upstream.seen[0].content))


def test_hop_by_hop_response_headers_are_not_relayed(client: httpx2.Client, upstream: MockUpstream) -> None:
    upstream.extra_response_headers = {"keep-alive": "timeout=99", "x-ratelimit-remaining": "7",
                                       "proxy-authenticate": "Basic", "date": "Mon, 30 Nov 2026 07:00:00 GMT",
                                       "connection": "x-upstream-hop", "x-upstream-hop": "drop-me"}
    response = post_chat(client)
    assert response.status_code == 200
    assert response.headers["x-ratelimit-remaining"] == "7"
    assert response.headers["x-ds-trace-id"] == "trace-1"
    assert "keep-alive" not in response.headers
    assert "proxy-authenticate" not in response.headers
    assert "x-upstream-hop" not in response.headers
    assert len(response.headers.get_list("date")) == 1


def test_passthrough_forwards_the_clients_own_key(client: httpx2.Client, upstream: MockUpstream) -> None:
    post_chat(client, headers={"authorization": "Bearer sk-clients-own-deepseek-key"})
    assert upstream.seen[0].headers.get_list("authorization") == ["Bearer sk-clients-own-deepseek-key"]


@pytest.fixture
def managed(start_gate: Callable[..., RunningChatgate], own_upstream: MockUpstream
            ) -> tuple[RunningChatgate, str]:
    gate = start_gate(upstream_url="http://deepseek.invalid", transport=own_upstream.transport,
                      auth={"mode": "managed", "upstream_api_key": "sk-deepseek-house-key"})
    key_id, secret, key_hash, prefix = new_key()
    gate.state.store.create_key(key_id, key_hash, prefix, "research", "alice-laptop")
    return gate, secret


def test_managed_mode_replaces_client_key_with_the_deepseek_key(managed: tuple[RunningChatgate, str],
                                                                own_upstream: MockUpstream) -> None:
    gate, secret = managed
    response = httpx2.post(gate.url + "/v1/chat/completions", content=orjson.dumps(chat_body()),
                           headers={**JSON_HEADERS, "authorization": f"Bearer {secret}", "api-key": secret},
                           timeout=10)
    assert response.status_code == 200, response.text
    sent = own_upstream.seen[0]
    assert sent.headers.get_list("authorization") == ["Bearer sk-deepseek-house-key"]
    assert all(secret not in value for _, value in sent.headers.multi_items())
    assert secret.encode() not in sent.content


def test_managed_mode_unknown_key_is_401_before_forwarding(managed: tuple[RunningChatgate, str],
                                                           own_upstream: MockUpstream) -> None:
    gate, _ = managed
    response = httpx2.post(gate.url + "/v1/chat/completions", content=orjson.dumps(chat_body()),
                           headers={**JSON_HEADERS, "authorization": "Bearer cg-not-a-real-key"}, timeout=10)
    assert_openai_error(response, 401, "invalid_api_key")
    assert own_upstream.seen == []


def test_non_ascii_header_value_is_forwarded_as_sent(client: httpx2.Client, upstream: MockUpstream) -> None:
    """obs-text (0x80-0xFF) is legal in a header value: forwarded byte for byte, not a 500."""
    headers = {b"content-type": b"application/json", b"authorization": b"Bearer sk-test-client-0001",
               b"x-team-label": "caf\u00e9".encode("latin-1")}
    response = client.post("/v1/chat/completions", content=orjson.dumps(chat_body()), headers=headers)
    assert response.status_code == 200, response.text
    assert (b"x-team-label", "caf\u00e9".encode("latin-1")) in upstream.seen[0].headers.raw


def test_non_ascii_request_id_is_replaced(client: httpx2.Client, upstream: MockUpstream) -> None:
    headers = {b"content-type": b"application/json", b"x-request-id": "r\u00e9q-1".encode("latin-1")}
    response = client.post("/v1/chat/completions", content=orjson.dumps(chat_body()), headers=headers)
    assert response.status_code == 200, response.text
    rid = response.headers["x-request-id"]
    assert rid.isascii() and rid != "r\u00e9q-1"
    assert upstream.seen[0].headers["x-request-id"] == rid
