"""The rules' evidence (issue 47) on SQLite and PostgreSQL: counts and statuses per rule, family and model,
the confirmation lease (one holder across replicas, taken again once expired), the unpredicted groups."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from chatgate.store import Store
from chatgate.store.base import EvidenceEvent

KEY = ("R37", "chat", "deepseek-flash")


def event(kind: str, status: str = "enforced", rule: str = "R37", promote_after: int = 0) -> EvidenceEvent:
    return EvidenceEvent(rule, "chat", "deepseek-flash", kind, status, f"req-{kind}", promote_after)


def test_confirmed_then_disputed_then_enforced_again(store: Store) -> None:
    [row] = store.record_evidence([event("confirmed")], 100.0)
    assert (row.status, row.confirmed, row.last_confirmed, row.example_request_id) == \
        ("enforced", 1, 100.0, "req-confirmed")
    [row] = store.record_evidence([event("disputed")], 200.0)
    assert (row.status, row.confirmed, row.disputed, row.last_disputed) == ("disputed", 1, 1, 200.0)
    store.record_evidence([event("warned"), event("warned")], 300.0)
    [row] = store.record_evidence([event("refused")], 400.0)  # DeepSeek refused it in the rule's words
    assert (row.status, row.warned, row.refused, row.last_confirmed) == ("enforced", 2, 1, 400.0)
    assert store.rule_evidence([KEY, ("R30", "chat", "deepseek-flash")]) == [row]
    assert store.rule_evidence(since=401.0) == []
    assert [r.rule for r in store.rule_evidence()] == ["R37"]


def test_a_warned_rule_is_promoted_only_when_never_accepted(store: Store) -> None:
    warned = [event(k, "warned", "R41", promote_after=2) for k in ("warned", "refused")]
    assert store.record_evidence(warned, 1.0)[-1].status == "warned"
    assert store.record_evidence(warned, 2.0)[-1].status == "enforced"
    other = [event(k, "warned", "R12", promote_after=2) for k in ("accepted", "refused", "refused")]
    assert store.record_evidence(other, 3.0)[-1].status == "warned"  # DeepSeek accepted it once
    assert store.record_evidence([event("refused", "warned", "R5")], 4.0)[-1].status == "warned"  # off


def test_reset_forgets_a_rule(store: Store) -> None:
    store.record_evidence([event("disputed"), EvidenceEvent("R37", "anthropic", "m", "disputed", "enforced",
                                                            "r")], 1.0)
    assert store.reset_evidence("R37", "anthropic") == 1
    assert store.reset_evidence("R37") == 1
    assert store.rule_evidence() == []


def test_the_lease_has_one_holder_until_it_expires_or_is_released(make_store: Callable[[], Store]) -> None:
    a, b = make_store(), make_store()
    a.migrate()
    assert a.take_rule_lease(KEY, "a", 10.0, 70.0)
    assert not b.take_rule_lease(KEY, "b", 11.0, 71.0)
    assert b.take_rule_lease(("R30", *KEY[1:]), "b", 11.0, 71.0)  # another rule: its own lease
    assert b.take_rule_lease(KEY, "b", 70.0, 130.0)  # a's holder died: its lease expired
    a.release_rule_lease(KEY, "a")  # not a's any more: nothing happens
    assert not a.take_rule_lease(KEY, "a", 80.0, 140.0)
    b.release_rule_lease(KEY, "b")
    assert a.take_rule_lease(KEY, "a", 81.0, 141.0)


@pytest.mark.postgres
def test_replicas_racing_for_one_lease_on_postgres(pg_url: str) -> None:
    from chatgate.store import open_store

    stores = [open_store(pg_url) for _ in range(6)]
    try:
        stores[0].migrate()
        start, won = threading.Barrier(len(stores)), []

        def race(i: int) -> None:
            start.wait()
            if stores[i].take_rule_lease(KEY, f"replica-{i}", 100.0, 160.0):
                won.append(i)

        threads = [threading.Thread(target=race, args=(i,)) for i in range(len(stores))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1
    finally:
        for s in stores:
            s.close()


def test_unpredicted_groups_count_and_keep_their_first_examples(store: Store) -> None:
    for i in range(7):
        store.record_unpredicted("chat", "deepseek-flash", "Invalid 'foo': at most N", f"id-{i}", 10.0 + i)
    store.record_unpredicted("anthropic", "deepseek-flash", "other", "x", 50.0)
    top, other = store.unpredicted()
    assert (top.count, top.first_seen, top.last_seen, top.family) == (7, 10.0, 16.0, "chat")
    assert top.example_request_ids == ("id-0", "id-1", "id-2", "id-3", "id-4")
    assert other.message == "other"
    assert [g.family for g in store.unpredicted(since=20.0)] == ["anthropic"]
