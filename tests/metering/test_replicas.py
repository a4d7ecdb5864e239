"""Two `chatgate serve` replicas sharing one PostgreSQL database: same keys, one usage report."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.fakes.server import run_fake_deepseek
from tests.harness import spawn_chatgate
from tests.metering.helpers import chat_body, cli, create_key, send_chat, usage_json, wait_for
from tests.pgutil import fresh_database

pytestmark = [pytest.mark.slow, pytest.mark.postgres]  # two chatgate processes on one store

MANAGED_ENV = {"DEEPSEEK_API_KEY": "sk-upstream", "CHATGATE_AUTH_KEY_CACHE_SECONDS": "0"}
COUNTED = ("prompt_tokens", "completion_tokens", "prompt_cache_hit_tokens", "prompt_cache_miss_tokens",
           "reasoning_tokens")


def test_two_replicas_share_keys_revocations_and_usage(tmp_path: Path) -> None:
    with fresh_database() as store, run_fake_deepseek() as fake:
        args = ("--upstream", fake.url, "--store", store, "--auth", "managed")
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        with spawn_chatgate(tmp_path / "a", *args, env=MANAGED_ENV, name="replica-a") as a, \
                spawn_chatgate(tmp_path / "b", *args, env=MANAGED_ENV, name="replica-b") as b:
            key_pay, secret_pay = create_key(store, "payments", "checkout-bot")
            key_search, secret_search = create_key(store, "search", "indexer")

            def call(n: int) -> tuple[str, int]:
                replica = (a, b)[n % 2]
                secret = (secret_pay, secret_search)[n % 3 == 0]
                resp = send_chat(replica.url, chat_body(n, stream=n % 4 < 2), key=secret, request_id=f"r{n}")
                return secret, resp.status_code

            with ThreadPoolExecutor(4) as pool:
                results = list(pool.map(call, range(24)))
            assert {status for _, status in results} == {200}
            # an invalid request is rejected locally on either replica and still metered
            empty = {"model": "deepseek-flash", "messages": []}
            bad = send_chat(b.url, empty, key=secret_pay, request_id="bad")
            assert bad.status_code == 400

            cli("keys", "revoke", key_search, "--store", store)
            for replica in (a, b):
                denied = send_chat(replica.url, chat_body(99), key=secret_search)
                assert denied.status_code == 401, denied.text
                assert send_chat(replica.url, chat_body(98), key=secret_pay).status_code == 200
            assert fake.state.wait_idle(5)
            expected_requests = 24 + 1 + 2
            wait_for(lambda: usage_json(store, "key")["totals"]["requests"] == expected_requests,
                     what="every replica's records in the store")
            assert a.terminate() == 0 and b.terminate() == 0

        report = usage_json(store, "key")
    issued = fake.state.issued_usage["sk-upstream"]
    assert report["group_by"] == "key"
    rows = {row["key_id"]: row for row in report["rows"]}
    assert set(rows) == {key_pay, key_search}
    assert (rows[key_pay]["key_name"], rows[key_pay]["team"]) == ("checkout-bot", "payments")
    assert (rows[key_search]["key_name"], rows[key_search]["team"]) == ("indexer", "search")
    search_calls = sum(1 for s, _ in results if s == secret_search)
    assert rows[key_search]["requests"] == search_calls
    assert rows[key_pay]["requests"] == 24 - search_calls + 1 + 2
    assert rows[key_pay]["rejected"] == 1 and rows[key_search]["rejected"] == 0
    totals = report["totals"]
    assert totals["requests"] == expected_requests
    assert totals["requests"] - totals["rejected"] == issued["requests"]
    for name in COUNTED:
        assert totals[name] == issued[name], name
        assert rows[key_pay][name] + rows[key_search][name] == totals[name], name
    assert totals["estimated_requests"] == 0
    assert totals["cost_picousd"] == rows[key_pay]["cost_picousd"] + rows[key_search]["cost_picousd"] > 0
