"""The HTTP surface's hygiene (issue 34 §7, §8, §10): /metrics can be protected with server.metrics_token; in
managed mode DeepSeek's 401 to chatgate's own key is chatgate's 502 `upstream_auth_failed` (never DeepSeek's
text, which names the key's last four characters), logged; a trailing slash is a 404 in the route's shape,
not a 307 built from the client's Host."""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx2
import pytest

from chatgate.gateway.auth import new_key
from tests.fakes.server import RunningFake
from tests.harness import RunningChatgate

CHAT = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}]}
UPSTREAM = "sk-bad-house-key-9999"  # the fake refuses keys starting sk-bad: "****9999 is invalid"


def test_metrics_are_open_unless_a_token_is_set(start_gate: Callable[..., RunningChatgate]) -> None:
    assert httpx2.get(start_gate().url + "/metrics").status_code == 200


def test_metrics_need_the_token_when_it_is_set(start_gate: Callable[..., RunningChatgate]) -> None:
    gate = start_gate(server={"metrics_token": "scrape-secret"})
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic scrape-secret"}):
        refused = httpx2.get(gate.url + "/metrics", headers=headers)
        assert refused.status_code == 401, headers
        assert refused.json()["error"]["code"] == "invalid_metrics_token"
        assert "chatgate_requests_total" not in refused.text
    scraped = httpx2.get(gate.url + "/metrics", headers={"authorization": "Bearer scrape-secret"})
    assert scraped.status_code == 200 and "chatgate_requests_total" in scraped.text


@pytest.mark.parametrize(("path", "body", "stream"), [
    ("/v1/chat/completions", CHAT, False),
    ("/v1/chat/completions", {**CHAT, "stream": True}, True),
    ("/anthropic/v1/messages", {**CHAT, "max_tokens": 10}, False),
    ("/v1/responses", {"model": "deepseek-flash", "input": "hi"}, False),
])
def test_deepseeks_401_to_chatgates_key_is_chatgates_own_error(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, caplog: pytest.LogCaptureFixture,
        path: str, body: dict[str, object], stream: bool) -> None:
    gate = start_gate(auth={"mode": "managed", "upstream_api_key": UPSTREAM})
    key_id, secret, digest, prefix = new_key()
    gate.state.store.create_key(key_id, digest, prefix, "search", "a1")
    with caplog.at_level(logging.ERROR, logger="chatgate"):
        resp = httpx2.post(gate.url + path, json=body, timeout=20,
                           headers={"authorization": f"Bearer {secret}"})
    assert resp.status_code == 502, resp.text
    assert "upstream_auth_failed" in resp.text
    assert "9999" not in resp.text and "Your api key" not in resp.text
    assert any("refused the upstream API key" in r.getMessage() for r in caplog.records)
    models = httpx2.get(gate.url + "/v1/models", headers={"authorization": f"Bearer {secret}"})
    assert "9999" not in models.text


def test_deepseeks_401_to_chatgates_key_on_files_is_chatgates_own_error(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.files.test_files import multipart
    gate = start_gate(auth={"mode": "managed", "upstream_api_key": UPSTREAM})
    key_id, secret, digest, prefix = new_key()
    gate.state.store.create_key(key_id, digest, prefix, "search", "a1")
    auth = {"authorization": f"Bearer {secret}"}
    content, headers = multipart()
    with caplog.at_level(logging.ERROR, logger="chatgate"):
        answers = [httpx2.post(gate.url + "/v1/files", content=content, timeout=20,
                               headers={**headers, **auth}),
                   httpx2.get(gate.url + "/v1/files", headers=auth, timeout=20)]
    assert [r.status_code for r in answers] == [502, 502], [r.text for r in answers]
    for resp in answers:
        assert resp.json()["error"]["code"] == "upstream_auth_failed"
        assert "9999" not in resp.text and "Your api key" not in resp.text
    assert any("refused the upstream API key" in r.getMessage() for r in caplog.records)
    assert len(fake.state.requests) == 2, "both reached DeepSeek, which refused chatgate's key"


@pytest.mark.parametrize(("path", "method", "anthropic"), [
    ("/v1/chat/completions/", "POST", False), ("/anthropic/v1/messages/", "POST", True),
    ("/v1/models/", "GET", False), ("/healthz/", "GET", False),
])
def test_a_trailing_slash_is_404_in_the_routes_shape(gate: RunningChatgate, fake: RunningFake, path: str,
                                                      method: str, anthropic: bool) -> None:
    resp = httpx2.request(method, gate.url + path, json=CHAT, headers={"host": "evil.example"})
    assert resp.status_code == 404, resp.text
    assert "location" not in resp.headers
    assert resp.json()["error"]["code"] == "not_found"
    assert (resp.json().get("type") == "error") is anthropic
    assert fake.state.requests == []
