"""Refusals confirmed with DeepSeek in-process (issue 47, docs/confirmation.md): the whole request path on the
test's event loop, the fake behind an ASGITransport."""

from __future__ import annotations

from pathlib import Path

from chatgate.demo.deepseek import FakeState
from chatgate.store import open_store
from tests.inprocess.gate import Gate, chat, run

R29 = chat(stream_options={"include_usage": True})


def test_a_refusal_is_confirmed_once_then_a_false_alarm_is_relayed(tmp_path: Path) -> None:
    async def scenario(g: Gate) -> None:
        for _ in range(2):
            refused = await g.post("/v1/chat/completions", R29)
            assert refused.status_code == 400 and refused.json()["error"]["code"] == \
                "stream_options_without_stream"
        assert len(g.fake.requests) == 1  # the first confirmed it; the second was refused at once
        store = g.state.store
        assert store is not None
        [row] = store.rule_evidence()
        assert (row.rule, row.status, row.confirmed) == ("R29", "enforced", 1)
        store.reset_evidence("R29")
        g.fake.configure(accept_refusals=["stream_options"])
        relayed = await g.post("/v1/chat/completions", R29)
        assert relayed.status_code == 200 and relayed.content == bytes(g.fake.requests[-1].sent)
        assert "R29" in relayed.headers["x-chatgate-warning"]
        [row] = store.rule_evidence()
        assert (row.status, row.disputed) == ("disputed", 1)
        records = await g.records(3)
        assert [r["outcome"] for r in records] == ["rejected", "rejected", "ok"]
        assert records[-1]["rule_code"] == "disputed:R29"

    run(tmp_path, scenario, FakeState(), validation={"confirm_every_s": 60})


def test_with_0_the_fake_never_sees_a_refused_request(tmp_path: Path) -> None:
    async def scenario(g: Gate) -> None:
        assert (await g.post("/v1/chat/completions", R29)).status_code == 400
        assert g.fake.requests == [] and g.state.gw.confirmations is None

    run(tmp_path, scenario)


def test_the_scores_of_warned_requests_are_written_when_chatgate_stops(tmp_path: Path) -> None:
    async def scenario(g: Gate) -> None:
        g.fake.configure(accept_refusals=["stream_options"])
        for _ in range(3):  # the first disputes R29; the next two are forwarded with its warning
            assert (await g.post("/v1/chat/completions", R29)).status_code == 200

    run(tmp_path, scenario, FakeState(), validation={"confirm_every_s": 60})
    store = open_store(f"sqlite:///{tmp_path}/usage.db")
    [row] = store.rule_evidence()
    store.close()
    assert (row.status, row.disputed, row.warned, row.accepted) == ("disputed", 1, 2, 2)
