"""Guessing the admin key (issue 48, finding 10): wrong keys are counted in /metrics and an address is
throttled after a few in a minute (429 with Retry-After); a placeholder or short admin key is refused at
start. Figures (2026-12-07): before, 200 guesses in 0.2 s, all 401 and none counted; after, the sixth guess
of a minute and every one after it is a 429, the first five are counted."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from chatgate.settings import load_settings
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[RunningChatgate]:
    settings = make_settings(tmp_path, auth={"admin_key": ADMIN_KEY, "admin_failures_per_minute": 5})
    with run_chatgate(settings) as running:
        yield running


def failures(gate: RunningChatgate) -> float:
    found = re.search(r'^chatgate_auth_failures_total\{source="127\.0\.0\.1"\} (\S+)$',
                      httpx2.get(gate.url + "/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def test_wrong_admin_keys_are_counted_then_throttled(gate: RunningChatgate) -> None:
    before = failures(gate)
    assert httpx2.get(gate.url + "/admin/keys").status_code == 401  # no key: refused, guesses nothing
    statuses = []
    for n in range(8):
        resp = httpx2.get(gate.url + "/admin/keys", headers={"authorization": f"Bearer guess-{n:04}"})
        statuses.append(resp.status_code)
    assert statuses == [401] * 5 + [429] * 3, statuses
    assert failures(gate) - before == 5
    right = httpx2.get(gate.url + "/admin/usage", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert right.status_code == 429, "while throttled, even a right guess is not told apart"
    assert right.json()["error"]["code"] == "admin_auth_throttled"
    assert 1 <= int(right.headers["retry-after"]) <= 60


@pytest.mark.parametrize("key", ["change-me", "CHANGE-ME", "short-admin-key-31-characters-x"])
def test_a_placeholder_or_short_admin_key_is_refused_at_start(key: str) -> None:
    with pytest.raises(Exception) as refused:
        load_settings(None, env={"CHATGATE_ADMIN_KEY": key}, flags={})
    message = str(refused.value)
    assert "openssl rand -hex 32" in message and "32 characters" in message
    assert key not in message, "the refused key is not repeated"


def test_a_long_random_admin_key_is_accepted() -> None:
    loaded = load_settings(None, env={"CHATGATE_ADMIN_KEY": "0" * 64}, flags={})
    assert loaded.settings.auth.admin_key is not None
