"""`GET /v1/models` and `GET /models` through a real chatgate: asked with the caller's upstream key and the
request's id, relayed as DeepSeek answers (its errors included, never cached), cached per upstream key;
chatgate's configured models only when DeepSeek cannot be reached. In managed mode a missing, unknown or
revoked chatgate key is a 401 before anything else, cached list or not."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import orjson
import pytest

from chatgate.demo.deepseek import MODEL_IDS
from chatgate.gateway.auth import new_key
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake
from tests.harness import RunningChatgate, make_settings, run_chatgate, unreachable_url

KEY = "sk-models-client-0001"
UPSTREAM = "sk-upstream-account-key"
LISTING = {"object": "list", "data": [{"id": "deepseek-v4-flash", "object": "model", "owned_by": "deepseek"}]}


def get(gate: RunningChatgate, key: str | None, path: str = "/v1/models", **headers: str) -> httpx2.Response:
    sent = dict(headers)
    if key is not None:
        sent["authorization"] = f"Bearer {key}"
    return httpx2.get(gate.url + path, headers=sent, timeout=10)


def configured(response: httpx2.Response) -> bool:
    """Whether this is chatgate's own list of its configured models (the unreachable-upstream fallback)."""
    return response.status_code == 200 and response.json().get("source") == "chatgate"


@dataclass
class Scripted:
    """A DeepSeek whose next answers to /models are scripted: a status and body, or an exception."""

    answers: list[tuple[int, bytes] | Exception] = field(default_factory=list)
    seen: list[httpx2.Request] = field(default_factory=list)

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        self.seen.append(request)
        answer = self.answers.pop(0) if self.answers else (200, orjson.dumps(LISTING))
        if isinstance(answer, Exception):
            raise answer
        status, body = answer
        return httpx2.Response(status, content=body, headers={"content-type": "application/json",
                                                              "x-ds-trace-id": "trace-models"})


@pytest.fixture
def scripted(start_gate: Callable[..., RunningChatgate]) -> tuple[RunningChatgate, Scripted]:
    mock = Scripted()
    gate = start_gate(upstream_url="http://deepseek.invalid", transport=httpx2.MockTransport(mock.handler))
    return gate, mock


# ------------------------------------------------------------------------------------------- passthrough


@pytest.mark.parametrize("path", ["/v1/models", "/models"])
def test_passthrough_forwards_the_callers_key_and_request_id(gate: RunningChatgate, fake: RunningFake,
                                                            path: str) -> None:
    response = get(gate, KEY, path, **{"x-request-id": "models-1"})
    assert response.status_code == 200
    assert [m["id"] for m in response.json()["data"]] == list(MODEL_IDS)
    (rec,) = fake.state.requests
    assert (rec.method, rec.path, rec.auth_key, rec.request_id) == ("GET", "/models", KEY, "models-1")
    assert response.headers["x-request-id"] == "models-1"


def test_a_generated_request_id_goes_upstream_and_back(gate: RunningChatgate, fake: RunningFake) -> None:
    response = get(gate, KEY)
    (rec,) = fake.state.requests
    assert rec.request_id is not None and len(rec.request_id) >= 16
    assert response.headers["x-request-id"] == rec.request_id


def test_passthrough_relays_deepseeks_401_and_never_caches_it(gate: RunningChatgate,
                                                              fake: RunningFake) -> None:
    assert get(gate, KEY).status_code == 200  # the good key's list is cached now
    bad = get(gate, "sk-bad-key-0042", **{"x-request-id": "models-bad"})
    assert bad.status_code == 401
    assert bad.json()["error"] == {"message": "Authentication Fails, Your api key: ****0042 is invalid",
                                   "type": "authentication_error", "param": None,
                                   "code": "invalid_request_error"}
    assert bad.headers["x-request-id"] == "models-bad"
    missing = get(gate, None)
    assert missing.status_code == 401 and "auth header format" in missing.json()["error"]["message"]
    assert get(gate, "sk-bad-key-0042").status_code == 401, "a 401 is not cached"
    assert [r.auth_key for r in fake.state.requests] == [KEY, "sk-bad-key-0042", None, "sk-bad-key-0042"]


def test_the_list_is_cached_per_upstream_key(gate: RunningChatgate, fake: RunningFake) -> None:
    assert get(gate, KEY).status_code == 200
    assert get(gate, KEY, "/models").status_code == 200
    other = "sk-models-client-0002"
    assert get(gate, other).status_code == 200
    assert [r.auth_key for r in fake.state.requests] == [KEY, other]


@pytest.mark.parametrize("status", [429, 500, 503])
def test_deepseeks_error_status_passes_through_uncached(scripted: tuple[RunningChatgate, Scripted],
                                                       status: int) -> None:
    gate, mock = scripted
    body = orjson.dumps({"error": {"message": f"upstream said {status}", "type": "api_error", "param": None,
                                   "code": None}})
    mock.answers.append((status, body))
    response = get(gate, KEY, **{"x-request-id": "models-error"})
    assert (response.status_code, response.content) == (status, body)
    assert response.headers["x-ds-trace-id"] == "trace-models"
    assert response.headers["x-request-id"] == "models-error"
    again = get(gate, KEY)
    assert again.json() == LISTING, "the error was not cached"
    assert len(mock.seen) == 2


def test_a_200_that_is_not_json_is_a_502_and_not_cached(scripted: tuple[RunningChatgate, Scripted]) -> None:
    gate, mock = scripted
    mock.answers.append((200, b"<html>gateway</html>"))
    response = get(gate, KEY)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_bad_response"
    assert get(gate, KEY).json() == LISTING
    assert len(mock.seen) == 2


@pytest.mark.parametrize("failure", [httpx2.ConnectError("refused"), httpx2.ReadTimeout("slow")],
                         ids=["connect-error", "timeout"])
def test_configured_models_when_deepseek_cannot_be_reached(scripted: tuple[RunningChatgate, Scripted],
                                                           failure: Exception) -> None:
    gate, mock = scripted
    mock.answers.append(failure)
    response = get(gate, KEY, **{"x-request-id": "models-down"})
    assert configured(response)
    assert {"deepseek-flash", "deepseek-chat"} <= {m["id"] for m in response.json()["data"]}
    assert response.headers["x-request-id"] == "models-down"
    assert get(gate, KEY).json() == LISTING, "the fallback was not cached"


def test_configured_models_when_the_upstream_refuses_connections(
        start_gate: Callable[..., RunningChatgate]) -> None:
    gate = start_gate(upstream_url=unreachable_url())
    assert configured(get(gate, KEY))


# ------------------------------------------------------------------------------------------- managed


@pytest.fixture
def managed(tmp_path: Path, fake: RunningFake) -> Iterator[tuple[RunningChatgate, SQLiteStore, str, str]]:
    """chatgate in managed mode in front of the fake, with one client key: (gate, store, key id, secret)."""
    store = SQLiteStore(tmp_path / "usage.db")
    settings = make_settings(tmp_path, fake.url, auth={"mode": "managed", "upstream_api_key": UPSTREAM,
                                                       "key_cache_seconds": 0})
    with run_chatgate(settings, store=store) as gate:
        key_id, secret, digest, prefix = new_key()
        store.create_key(key_id, digest, prefix, "search", "crawler")
        yield gate, store, key_id, secret


def test_managed_asks_with_the_upstream_key(managed: tuple[RunningChatgate, SQLiteStore, str, str],
                                           fake: RunningFake) -> None:
    gate, _, _, secret = managed
    response = get(gate, secret, **{"x-request-id": "managed-models"})
    assert response.status_code == 200
    (rec,) = fake.state.requests
    assert (rec.auth_key, rec.request_id) == (UPSTREAM, "managed-models")
    assert secret not in orjson.dumps(rec.headers).decode()


@pytest.mark.parametrize("path", ["/v1/models", "/models"])
def test_managed_refuses_missing_and_unknown_keys_with_401(
        managed: tuple[RunningChatgate, SQLiteStore, str, str], fake: RunningFake, path: str) -> None:
    gate, _, _, secret = managed
    assert get(gate, secret, path).status_code == 200  # cached now: the 401s come first all the same
    for key in ("cg-not-a-key", None, UPSTREAM):
        response = get(gate, key, path, **{"x-request-id": "refused-models"})
        assert response.status_code == 401, key
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.headers["x-request-id"] == "refused-models"
    assert len(fake.state.requests) == 1


def test_managed_refuses_a_revoked_key_even_with_the_list_cached(
        managed: tuple[RunningChatgate, SQLiteStore, str, str], fake: RunningFake) -> None:
    gate, store, key_id, secret = managed
    assert get(gate, secret).status_code == 200
    assert store.revoke_key(key_id)
    response = get(gate, secret)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert len(fake.state.requests) == 1


def test_managed_refuses_before_falling_back(tmp_path: Path) -> None:
    """DeepSeek unreachable: a stranger still gets the 401, not the configured models."""
    settings = make_settings(tmp_path, unreachable_url(),
                             auth={"mode": "managed", "upstream_api_key": UPSTREAM})
    with run_chatgate(settings) as gate:
        key_id, secret, digest, prefix = new_key()
        gate.state.store.create_key(key_id, digest, prefix, "search", "crawler")
        assert get(gate, "cg-not-a-key").status_code == 401
        assert configured(get(gate, secret))
