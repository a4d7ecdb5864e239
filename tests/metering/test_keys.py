"""Managed keys: `chatgate keys create|list|revoke`, and 401 before anything else for unknown/revoked keys."""

from __future__ import annotations

import hashlib
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from chatgate.gateway.auth import new_key
from chatgate.store.base import ApiKey
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import RunningChatgate, SpawnedChatgate, make_settings, run_chatgate, spawn_chatgate
from tests.metering.helpers import chat_body, cli, create_key, send_chat

pytestmark = pytest.mark.slow  # the CLI as processes

MANAGED_ENV = {"DEEPSEEK_API_KEY": "sk-upstream", "CHATGATE_AUTH_KEY_CACHE_SECONDS": "0"}


@pytest.fixture
def managed(tmp_path: Path) -> Iterator[tuple[str, RunningFake, SpawnedChatgate]]:
    store = f"sqlite:///{tmp_path}/keys.db"
    with run_fake_deepseek() as fake, spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", store,
                                                     "--auth", "managed", env=MANAGED_ENV) as cg:
        yield store, fake, cg


def test_create_prints_the_key_once_on_its_last_line_and_stores_only_a_hash(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/keys.db"
    proc = cli("keys", "create", "--team", "payments", "--name", "checkout-bot", "--store", store)
    lines = proc.stdout.strip().splitlines()
    secret = lines[-1]
    assert secret.startswith("cg-") and len(secret) > 30 and " " not in secret
    assert proc.stdout.count(secret) == 1
    conn = sqlite3.connect(tmp_path / "keys.db")
    dump = "\n".join(conn.iterdump())
    assert secret not in dump, "the secret itself is never stored"
    assert hashlib.sha256(secret.encode()).hexdigest() in dump


def test_list_never_shows_secrets_and_revoke_marks_the_key(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/keys.db"
    key_a, secret_a = create_key(store, "payments", "checkout-bot")
    key_b, secret_b = create_key(store, "search", "indexer")
    listing = cli("keys", "list", "--store", store).stdout
    assert key_a in listing and key_b in listing and "checkout-bot" in listing and "search" in listing
    assert secret_a not in listing and secret_b not in listing
    assert secret_a[8:20] not in listing  # not even a long piece of it; only a short prefix
    assert cli("keys", "revoke", key_a, "--store", store).stdout.strip() == f"revoked {key_a}"
    row_a = next(line for line in cli("keys", "list", "--store", store).stdout.splitlines() if key_a in line)
    row_b = next(line for line in cli("keys", "list", "--store", store).stdout.splitlines() if key_b in line)
    # the revoked key's row ends with the day it was revoked; the other's has no such column filled
    revoked_on = row_a.split()[-1]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", revoked_on), row_a
    assert len(row_a.split()) > len(row_b.split()), (row_a, row_b)
    again = cli("keys", "revoke", key_a, "--store", store, check=False)
    assert again.returncode == 1 and key_a in again.stderr
    assert cli("keys", "revoke", "key_doesnotexist", "--store", store, check=False).returncode == 1


def test_managed_key_works_and_upstream_sees_only_the_upstream_key(
        managed: tuple[str, RunningFake, SpawnedChatgate]) -> None:
    store, fake, cg = managed
    _, secret = create_key(store, "payments", "checkout-bot")
    client = openai.OpenAI(base_url=cg.url + "/v1", api_key=secret, max_retries=0)
    answer = client.chat.completions.create(model="deepseek-flash",
                                            messages=[{"role": "user", "content": "Refund order 1182?"}])
    assert answer.choices[0].message.content
    assert [r.auth_key for r in fake.state.requests] == ["sk-upstream"]
    assert secret not in fake.state.requests[0].headers.get("authorization", "")


def test_unknown_or_missing_key_is_401_before_anything_reaches_upstream(
        managed: tuple[str, RunningFake, SpawnedChatgate]) -> None:
    _, fake, cg = managed
    for auth in (None, "Bearer cg-not-a-real-key", "Bearer sk-some-deepseek-key", "Basic abc", "Bearer"):
        headers = {"authorization": auth} if auth else {}
        resp = send_chat(cg.url, chat_body(1), key=None, headers=headers)
        assert resp.status_code == 401, (auth, resp.text)
        error = resp.json()["error"]
        assert error["type"] == "authentication_error" and error["message"], auth
        assert {"message", "type", "param", "code"} <= set(error)
    assert fake.state.requests == []


def test_401_comes_before_body_validation(managed: tuple[str, RunningFake, SpawnedChatgate]) -> None:
    """Even an invalid body (R-rule violations) from an unknown key gets 401, not 400."""
    _, fake, cg = managed
    resp = send_chat(cg.url, {"model": "deepseek-flash", "messages": []}, key="cg-nope")
    assert resp.status_code == 401
    assert fake.state.requests == []


def test_revoked_key_is_401_with_the_openai_sdk(managed: tuple[str, RunningFake, SpawnedChatgate]) -> None:
    store, fake, cg = managed
    key_id, secret = create_key(store, "payments", "checkout-bot")
    client = openai.OpenAI(base_url=cg.url + "/v1", api_key=secret, max_retries=0)
    client.chat.completions.create(model="deepseek-flash", messages=[{"role": "user", "content": "hi"}])
    cli("keys", "revoke", key_id, "--store", store)
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(model="deepseek-flash", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 401
    assert len(fake.state.requests) == 1, "the revoked key's request never reached upstream"


class CountingStore(SQLiteStore):
    """Counts key look-ups, to show which requests the key cache answered."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.lookups = 0

    def find_key(self, key_hash: str) -> ApiKey | None:
        self.lookups += 1
        return super().find_key(key_hash)


CACHE_SECONDS = 0.6


@pytest.fixture
def cached(tmp_path: Path) -> Iterator[tuple[CountingStore, RunningFake, RunningChatgate]]:
    """Managed mode with a small non-zero key cache (the README promises revocation within it)."""
    store = CountingStore(tmp_path / "keys.db")
    with run_fake_deepseek() as fake:
        settings = make_settings(tmp_path, fake.url, auth={
            "mode": "managed", "upstream_api_key": "sk-upstream", "key_cache_seconds": CACHE_SECONDS})
        with run_chatgate(settings, store=store) as gate:
            yield store, fake, gate


def status(gate: RunningChatgate, secret: str) -> int:
    return send_chat(gate.url, chat_body(1), key=secret).status_code


def until_status(gate: RunningChatgate, secret: str, want: int, limit: float) -> float:
    """Seconds until the key's requests get `want` (polled); fails after `limit`."""
    start = time.monotonic()
    while status(gate, secret) != want:
        assert time.monotonic() - start < limit, f"still not {want} after {limit} s"
        time.sleep(0.02)
    return time.monotonic() - start


def test_a_revocation_takes_effect_within_the_key_cache_time(
        cached: tuple[CountingStore, RunningFake, RunningChatgate]) -> None:
    store, fake, gate = cached
    key_id, secret, digest, prefix = new_key()
    store.create_key(key_id, digest, prefix, "payments", "bot")
    assert status(gate, secret) == 200
    assert status(gate, secret) == 200
    assert store.lookups == 1, "the second request was answered from the cache"
    assert store.revoke_key(key_id)
    took = until_status(gate, secret, 401, limit=CACHE_SECONDS + 3)
    assert took <= CACHE_SECONDS + 1.0, f"the revocation took {took:.2f} s with a {CACHE_SECONDS} s cache"
    assert store.lookups >= 2
    assert {r.auth_key for r in fake.state.requests} == {"sk-upstream"}


def test_an_unknown_key_is_cached_too_and_works_once_the_cache_expires(
        cached: tuple[CountingStore, RunningFake, RunningChatgate]) -> None:
    """Negative caching: a flood of unknown keys costs one look-up per key and cache period."""
    store, _, gate = cached
    key_id, secret, digest, prefix = new_key()
    assert status(gate, secret) == 401
    assert status(gate, secret) == 401
    assert store.lookups == 1, "the unknown key's second request was answered from the cache"
    store.create_key(key_id, digest, prefix, "payments", "late")
    took = until_status(gate, secret, 200, limit=CACHE_SECONDS + 3)
    assert took <= CACHE_SECONDS + 1.0
