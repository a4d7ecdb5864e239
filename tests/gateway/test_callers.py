"""Who the caller is (issue 34 §6, §11): one reading of the key, DeepSeek's precedence (`Authorization:
Bearer`, else `x-api-key`), everywhere; an empty or non-Bearer Authorization beside an x-api-key does not
make the caller anonymous (unmetered, unlimited) while that key is forwarded and billed. Unknown keys are
cached apart from valid ones (a flood of made-up keys flushes no valid key), and 401s are counted per
client address."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatgate.gateway.auth import (
    PASSTHROUGH_CACHED,
    Authenticator,
    cache_digest,
    client_key,
    fingerprint,
    hash_key,
    new_key,
)
from chatgate.metering.metrics import AUTH_SOURCES, Metrics
from chatgate.settings import AuthSettings
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake
from tests.gateway.conftest import usage_rows
from tests.harness import RunningChatgate
from tests.quotas.support import set_limits

KEY = "sk-caller-precedence-0001"
MESSAGES = {"model": "deepseek-flash", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("headers", "expected"), [
    ({"authorization": "Bearer sk-a", "x-api-key": "sk-b"}, "Bearer sk-a"),
    ({"authorization": "Basic dXNlcjpwYXNz", "x-api-key": "sk-b"}, "Bearer sk-b"),
    ({"authorization": "", "x-api-key": "sk-b"}, "Bearer sk-b"),
    ({"authorization": "Bearer ", "x-api-key": "sk-b"}, "Bearer sk-b"),
    ({"x-api-key": "sk-b"}, "Bearer sk-b"),
    ({"authorization": "Basic dXNlcjpwYXNz"}, "Basic dXNlcjpwYXNz"),
    ({"x-api-key": " "}, None),
    ({}, None),
])
def test_the_key_is_read_by_deepseeks_precedence(headers: dict[str, str], expected: str | None) -> None:
    assert client_key(headers) == expected


@pytest.mark.parametrize("authorization", ["Basic dXNlcjpwYXNz", "", "Bearer"])
def test_a_passthrough_caller_with_a_bad_authorization_is_its_x_api_key(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path, authorization: str
) -> None:
    gate = start_gate()
    set_limits(f"sqlite:///{tmp_path}/usage.db", "key", fingerprint(KEY), rpm=1)
    headers = {"authorization": authorization, "x-api-key": KEY}
    first = httpx2.post(gate.url + "/anthropic/v1/messages", json=MESSAGES, headers=headers, timeout=20)
    second = httpx2.post(gate.url + "/anthropic/v1/messages", json=MESSAGES, headers=headers, timeout=20)
    assert first.status_code == 200, first.text
    assert second.status_code == 429, "the key's rpm limit applies"
    rows = usage_rows(tmp_path, 2)
    assert [r["key_id"] for r in rows] == [fingerprint(KEY)] * 2
    assert len(fake.state.requests) == 1
    assert fake.state.requests[0].headers["authorization"] == f"Bearer {KEY}", "DeepSeek reads that key"


@pytest.mark.parametrize("path", ["/v1/models", "/v1/files", "/user/balance"])
def test_every_passthrough_route_sends_deepseek_the_callers_x_api_key(
        gate: RunningChatgate, fake: RunningFake, path: str) -> None:
    resp = httpx2.get(gate.url + path, timeout=20, headers={"authorization": "Basic dXNlcjpwYXNz",
                                                            "x-api-key": KEY})
    assert resp.status_code == 200, resp.text
    assert fake.state.requests[-1].headers["authorization"] == f"Bearer {KEY}"


def test_a_managed_key_in_x_api_key_beside_a_basic_authorization_is_the_caller(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path) -> None:
    gate = start_gate(auth={"mode": "managed", "upstream_api_key": "sk-house"})
    key_id, secret, digest, prefix = new_key()
    gate.state.store.create_key(key_id, digest, prefix, "platform", "claude-code")
    resp = httpx2.post(gate.url + "/anthropic/v1/messages", json=MESSAGES, timeout=20,
                       headers={"authorization": "Basic dXNlcjpwYXNz", "x-api-key": secret})
    assert resp.status_code == 200, resp.text
    assert usage_rows(tmp_path, 1)[0]["key_id"] == key_id


class CountingStore(SQLiteStore):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.lookups: list[str] = []

    def find_key(self, key_hash: str) -> Any:
        self.lookups.append(key_hash)
        return super().find_key(key_hash)


def test_a_flood_of_unknown_keys_does_not_flush_the_valid_ones(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "keys.db")
    store.migrate()
    key_id, secret, digest, prefix = new_key()
    store.create_key(key_id, digest, prefix, "search", "a1")
    auth = Authenticator(AuthSettings(mode="managed", key_cache_seconds=600), store)

    async def attack() -> None:
        assert (await auth.identify(f"Bearer {secret}")).key_id == key_id
        for i in range(12_000):
            with pytest.raises(Exception, match="Invalid chatgate API key"):
                await auth.identify(f"Bearer cg-made-up-{i}")
        assert (await auth.identify(f"Bearer {secret}")).key_id == key_id
        with pytest.raises(Exception, match="Invalid chatgate API key"):  # a recent unknown one: cached
            await auth.identify("Bearer cg-made-up-11999")

    asyncio.run(attack())
    assert store.lookups.count(digest) == 1, "the valid key was never looked up again"
    assert store.lookups.count(hash_key("cg-made-up-11999")) == 1
    assert len(store.lookups) == 12_001


def test_401s_are_counted_per_client_address(start_gate: Callable[..., RunningChatgate]) -> None:
    gate = start_gate(auth={"mode": "managed", "upstream_api_key": "sk-house"})
    for headers in ({"authorization": "Bearer cg-nope-1"}, {"x-api-key": "cg-nope-2"}, {}):
        resp = httpx2.post(gate.url + "/v1/chat/completions", json=MESSAGES, timeout=20, headers=headers)
        assert resp.status_code == 401
    assert httpx2.post(gate.url + "/v1/chat/completions/validate", json=MESSAGES).status_code == 401
    text = httpx2.get(gate.url + "/metrics").text
    assert 'chatgate_auth_failures_total{source="127.0.0.1"} 4.0' in text


def test_the_401_label_set_is_bounded() -> None:
    metrics = Metrics()
    for i in range(AUTH_SOURCES + 50):
        metrics.auth_failure(f"10.0.{i // 256}.{i % 256}")
    text = metrics.render().decode()
    assert text.count("chatgate_auth_failures_total{") == AUTH_SOURCES + 1
    assert 'chatgate_auth_failures_total{source="other"} 50.0' in text


def test_a_passthrough_identity_is_computed_once_per_key_and_the_memory_is_bounded() -> None:
    auth = Authenticator(AuthSettings(mode="passthrough"), None)

    async def calls() -> None:
        first = await auth.identify("Bearer sk-one")
        assert first.key_id == fingerprint("sk-one") and first.upstream_authorization == "Bearer sk-one"
        assert await auth.identify("Bearer sk-one") is first
        other = await auth.identify("Bearer sk-two")
        assert other.key_id == fingerprint("sk-two") and other.caller != first.caller
        for i in range(PASSTHROUGH_CACHED + 10):
            assert (await auth.identify(f"Bearer sk-flood-{i}")).key_id == fingerprint(f"sk-flood-{i}")
        assert len(auth._passthrough_ids) <= PASSTHROUGH_CACHED
        assert (await auth.identify("Bearer sk-one")) == first

    asyncio.run(calls())


def test_a_managed_identity_is_kept_as_long_as_its_key_and_a_revocation_here_ends_it(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "keys.db")
    store.migrate()
    key_id, secret, digest, prefix = new_key()
    store.create_key(key_id, digest, prefix, "search", "a1")
    auth = Authenticator(AuthSettings(mode="managed", key_cache_seconds=600), store)
    uncached = Authenticator(AuthSettings(mode="managed", key_cache_seconds=0), store)

    async def calls() -> None:
        first = await auth.identify(f"Bearer {secret}")
        assert (first.key_id, first.caller) == (key_id, key_id)
        assert await auth.identify(f"Bearer {secret}") is first
        for _ in range(2):
            assert (await uncached.identify(f"Bearer {secret}")).key_id == key_id
        store.revoke_key(key_id)
        assert await auth.identify(f"Bearer {secret}") is first  # other replicas: within key_cache_seconds
        auth.forget_key(key_id)
        with pytest.raises(Exception, match="Invalid chatgate API key"):
            await auth.identify(f"Bearer {secret}")

    asyncio.run(calls())
    assert store.lookups == [digest, digest, digest, digest], "one look-up each, none while cached"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/anthropic/v1/messages"])
def test_a_deepseek_key_sent_in_managed_mode_is_named_as_one(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, path: str) -> None:
    gate = start_gate(auth={"mode": "managed", "upstream_api_key": "sk-house"})
    resp = httpx2.post(gate.url + path, json=MESSAGES, timeout=20,
                       headers={"authorization": "Bearer sk-0123456789abcdef0123456789abcdef"})
    assert resp.status_code == 401, resp.text
    message = resp.text
    assert "cg-…" in message and "chatgate keys create" in message
    assert "looks like a DeepSeek API key (sk-…)" in message and "CHATGATE_API_KEY" in message
    assert not fake.state.requests, "nothing went upstream"

    other = httpx2.post(gate.url + path, json=MESSAGES, timeout=20,
                        headers={"authorization": "Bearer cg-made-up"})
    assert other.status_code == 401
    assert "cg-…" in other.text and "DeepSeek API key" not in other.text


def test_no_cache_keeps_a_key_by_its_plaintext(tmp_path: Path) -> None:
    """Identities are cached by a keyed digest of the key sent: no dict of the authenticator has the secret
    (or the Authorization carrying it) as a key, and the digest is neither the store's nor another
    process's."""
    store = CountingStore(tmp_path / "keys.db")
    store.migrate()
    key_id, secret, digest, prefix = new_key()
    store.create_key(key_id, digest, prefix, "search", "a1")
    managed = Authenticator(AuthSettings(mode="managed", key_cache_seconds=600), store)
    passthrough = Authenticator(AuthSettings(mode="passthrough"), None)

    async def calls() -> None:
        for _ in range(2):
            assert (await managed.identify(f"Bearer {secret}")).key_id == key_id
            await passthrough.identify("Bearer sk-plaintext-0001")

    asyncio.run(calls())
    for auth, plaintext in ((managed, secret), (passthrough, "sk-plaintext-0001")):
        keys = [k for value in vars(auth).values() if isinstance(value, dict) for k in value]
        assert keys, "the identity is cached"
        assert not [k for k in keys if plaintext in (k.decode("latin-1") if isinstance(k, bytes) else str(k))]
    assert cache_digest(managed._salt, secret) in managed._managed_ids
    assert cache_digest(managed._salt, secret).hex() != digest
    assert managed._salt != passthrough._salt
