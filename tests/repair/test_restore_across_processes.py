"""restore_reasoning where it is hard: the next round lands on another replica (two `chatgate serve`
processes on one PostgreSQL store, requests alternating, the tool answering in 0 ms), or after chatgate was
killed and restarted between two rounds (SQLite). Another key replaying the ids still gets the 400."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.server import run_fake_deepseek
from tests.harness import make_settings, run_chatgate, spawn_chatgate
from tests.pgutil import fresh_database
from tests.repair.clients import DroppingAgent, post

pytestmark = pytest.mark.slow  # chatgate processes on one store


@pytest.mark.postgres
@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_alternating_replicas_on_postgresql_restore_each_others_turns(tmp_path: Path, stream: bool) -> None:
    with fresh_database() as store, run_fake_deepseek() as fake:
        args = ("--upstream", fake.url, "--store", store)
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        with spawn_chatgate(tmp_path / "a", *args, name="replica-a") as a, \
                spawn_chatgate(tmp_path / "b", *args, name="replica-b") as b:
            agents = [DroppingAgent(key=f"sk-agent-{n}") for n in range(3)]
            for n in range(6):  # each round on the other replica than the last
                for k, agent in enumerate(agents):
                    replica = (a, b)[(n + k) % 2]
                    resp = agent.round(replica.url, stream)
                    assert resp.status_code == 200, (n, k, resp.text)
                    expected = "; ".join(f"restore_reasoning@messages[{1 + 3 * r}]" for r in range(n))
                    assert resp.headers.get("x-chatgate-repaired", "") == expected
            stranger = post(b.url, agents[0].body(stream=False), key="sk-not-the-agent")
            assert stranger.status_code == 400
            assert stranger.json()["error"]["code"] == "reasoning_content_missing"
            assert "The user sent" not in stranger.text
    assert all(r.status == 200 for r in fake.state.requests)
    assert len(fake.state.requests) == 18


def test_a_restart_between_rounds_keeps_the_turns_sqlite(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/usage.db"
    agent = DroppingAgent()
    with run_fake_deepseek() as fake:
        with spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", store, name="first") as first:
            assert agent.round(first.url, stream=True).status_code == 200
            first.kill9()  # no graceful stop: the turn was in the ring file before the client had the
            # answer's end, and the next process reads the file back before it serves
        with spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", store, name="second") as second:
            resp = agent.round(second.url, stream=False)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-chatgate-repaired"] == "restore_reasoning@messages[1]"
            assert second.terminate() == 0


@pytest.mark.postgres
def test_the_cache_is_the_durable_copy_only_where_no_other_process_reads_the_store_first(tmp_path: Path
                                                                                      ) -> None:
    """SQLite with one worker: the turn cache's ring file in the spool directory. Several workers on
    SQLite, or PostgreSQL (replicas): the store itself, before the answer's end, since the next round may
    land elsewhere."""
    with run_chatgate(make_settings(tmp_path / "one")) as gate:
        assert gate.state.memory is not None and gate.state.memory.durable
        assert list((tmp_path / "one" / "spool").glob("turns-*.ring"))
    with run_chatgate(make_settings(tmp_path / "two", server={"workers": 2})) as gate:
        assert gate.state.memory is not None and not gate.state.memory.durable
    with fresh_database() as url, run_chatgate(make_settings(tmp_path / "pg", store={"url": url})) as gate:
        assert gate.state.memory is not None and not gate.state.memory.durable
