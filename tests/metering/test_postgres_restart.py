"""The real thing: the PostgreSQL server on this machine is stopped mid-run and started again.

chatgate keeps serving, /readyz names the store, the records wait in the spool, and once PostgreSQL is
back they are all written, nothing lost, nothing doubled. (test_store_outage.py covers the same with a
forwarder it cuts, including a dead network path; this one stops the server itself.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx2
import psycopg
import pytest

from tests.ci import missing
from tests.fakes.server import run_fake_deepseek
from tests.harness import SpawnedChatgate, spawn_chatgate
from tests.metering.helpers import complete, wait_for
from tests.pgutil import fresh_database, server_to_itself

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def cluster() -> tuple[str, str] | None:
    """(version, name) of the local cluster that pg_ctlcluster manages, when this machine has one."""
    if shutil.which("pg_ctlcluster") is None or os.geteuid() != 0 or not Path("/etc/postgresql").is_dir():
        return None
    versions = sorted(os.listdir("/etc/postgresql"))
    return (versions[-1], "main") if versions else None


def pg_ctl(action: str) -> None:
    found = cluster()
    assert found is not None
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", *found, action], check=True,
                   capture_output=True, timeout=60)


def pg_request_ids(url: str) -> list[str]:
    with psycopg.connect(url, connect_timeout=3) as conn:
        return [row[0] for row in conn.execute("SELECT request_id FROM usage")]


@pytest.fixture
def restartable() -> Iterator[None]:
    if cluster() is None:
        missing("needs root and pg_ctlcluster to stop and start the local PostgreSQL server")
    with server_to_itself():  # no other test (a parallel worker's) has a database on it meanwhile
        yield


@pytest.fixture
def gate(tmp_path: Path, restartable: None) -> Iterator[tuple[str, SpawnedChatgate]]:
    with fresh_database() as db_url, run_fake_deepseek() as fake:
        env = {"CHATGATE_STORE_RETRY_SECONDS": "0.2"}
        with spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", db_url, env=env) as cg:
            yield db_url, cg


def test_postgres_stopped_and_started_again_loses_and_doubles_nothing(
        gate: tuple[str, SpawnedChatgate]) -> None:
    db_url, cg = gate
    before = [complete(cg.url, i, stream=i % 2 == 0, rid=f"pg-before-{i}") for i in range(4)]
    wait_for(lambda: len(pg_request_ids(db_url)) == 4, what="records before the stop")
    pg_ctl("stop")
    try:
        during = [complete(cg.url, i, stream=i % 2 == 1, rid=f"pg-during-{i}") for i in range(6)]
        ready = httpx2.get(cg.url + "/readyz", timeout=30)
        assert ready.status_code == 503, ready.text
        assert any("store" in p for p in ready.json()["problems"]), ready.json()
        assert ready.json()["spooled_records"] == 6
    finally:
        pg_ctl("start")
        wait_for(lambda: subprocess.run(["pg_isready", "-h", "127.0.0.1", "-q"]).returncode == 0,
                 timeout=60, what="PostgreSQL accepting connections again")
    wait_for(lambda: len(pg_request_ids(db_url)) >= 10, timeout=60, what="spooled records written")
    wait_for(lambda: httpx2.get(cg.url + "/readyz", timeout=10).status_code == 200, timeout=30,
             what="ready again")
    assert Counter(pg_request_ids(db_url)) == Counter(before + during)
