"""PostgreSQL outage: chatgate keeps serving, /readyz says the store is the problem, records stay spooled,
and once the path is back everything is written, nothing lost, nothing doubled.

The outage is a TCP forwarder between chatgate and the shared PostgreSQL server that the test cuts: the
server itself keeps running for the other tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import psycopg
import pytest

from tests.fakes.server import run_fake_deepseek
from tests.harness import SpawnedChatgate, spawn_chatgate
from tests.metering.forwarder import TcpForwarder, forwarder
from tests.metering.helpers import complete, wait_for
from tests.pgutil import fresh_database

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def pg_request_ids(url: str) -> list[str]:
    with psycopg.connect(url, connect_timeout=5) as conn:
        return [row[0] for row in conn.execute("SELECT request_id FROM usage")]


def via(url: str, port: int) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}").geturl()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[str, TcpForwarder, SpawnedChatgate]]:
    with fresh_database() as db_url, forwarder(urlsplit(db_url).port or 5432) as fwd, \
            run_fake_deepseek() as fake:
        env = {"CHATGATE_STORE_RETRY_SECONDS": "0.2"}
        args = ("--upstream", fake.url, "--store", via(db_url, fwd.port))
        with spawn_chatgate(tmp_path, *args, env=env) as cg:
            yield db_url, fwd, cg


def readyz(cg: SpawnedChatgate, timeout: float = 30) -> httpx2.Response:
    # The timeout only catches a hang; the assertions are on the answer.
    return httpx2.get(cg.url + "/readyz", timeout=timeout)


@pytest.mark.parametrize("mode", ["refuse", "blackhole"])
def test_store_outage_spools_then_writes_everything_once(
        setup: tuple[str, TcpForwarder, SpawnedChatgate], mode: str) -> None:
    """refuse = PostgreSQL went away (connections reset); blackhole = the path is dead (nothing answers,
    the case where a ping or an insert without a client-side deadline hangs)."""
    db_url, fwd, cg = setup
    before = [complete(cg.url, i, stream=i % 2 == 0, rid=f"before-{i}") for i in range(4)]
    wait_for(lambda: len(pg_request_ids(db_url)) == 4, what="records before the outage")
    assert readyz(cg).status_code == 200

    fwd.set_mode(mode)
    during = [complete(cg.url, i, stream=i % 2 == 1, rid=f"during-{i}") for i in range(8)]  # keeps serving
    ready = readyz(cg, timeout=15)
    assert ready.status_code == 503, ready.text
    assert any("store" in p for p in ready.json()["problems"]), ready.json()
    assert ready.json()["spooled_records"] == 8
    assert Counter(pg_request_ids(db_url)) == Counter(before), "nothing new reached the store while cut"
    spool = "".join(p.read_text() for p in (Path(cg.log_path).parent / "spool").glob("spool-*.jsonl"))
    assert all(f'"request_id":"{rid}"' in spool for rid in during)

    fwd.set_mode("open")
    wait_for(lambda: len(pg_request_ids(db_url)) >= 12, timeout=30, what="spooled records written")
    wait_for(lambda: readyz(cg).status_code == 200, timeout=30, what="ready again")
    after = [complete(cg.url, 9, stream=True, rid="after-0")]
    wait_for(lambda: len(pg_request_ids(db_url)) >= 13, what="record after the outage")
    assert Counter(pg_request_ids(db_url)) == Counter(before + during + after)
    assert readyz(cg).json() == {"ready": True, "problems": [], "spooled_records": 0}


def test_a_model_name_postgresql_cannot_hold_is_metered_and_metering_goes_on(tmp_path: Path) -> None:
    """A client's model name with a NUL (valid JSON; PostgreSQL's text cannot hold it; refused locally, as
    DeepSeek refuses it: R1): its rejected record is stored with U+FFFD in the NUL's place, and the records
    after it are stored too (once, such a record wedged the usage writer: it retried it for
    ever as if PostgreSQL were down)."""
    with fresh_database() as db_url, run_fake_deepseek() as fake, \
            spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", db_url) as cg:
        body = {"model": "deepseek-chat\u0000v2", "messages": [{"role": "user", "content": "hi"}]}
        answered = httpx2.post(cg.url + "/v1/chat/completions", json=body, timeout=10,
                               headers={"authorization": "Bearer sk-team-a", "x-request-id": "nul-model"})
        assert answered.status_code == 400, answered.text
        assert answered.json()["error"]["code"] == "invalid_model"
        after = [complete(cg.url, i, stream=False, rid=f"after-{i}") for i in range(3)]
        wait_for(lambda: len(pg_request_ids(db_url)) == 4, what="every record, the NUL model's too")
        assert sorted(pg_request_ids(db_url)) == sorted(["nul-model", *after])
        with psycopg.connect(db_url, connect_timeout=5) as conn:
            (model, outcome) = conn.execute(
                "SELECT model, outcome FROM usage WHERE request_id = 'nul-model'").fetchone()
        assert (model, outcome) == ("deepseek-chat\ufffdv2", "rejected")
        assert readyz(cg).status_code == 200
