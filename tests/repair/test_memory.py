"""TurnMemory: bounded, expiring, per caller; shared through the store, and still working when it fails."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from chatgate.repair.base import Turn
from chatgate.repair.memory import TurnMemory
from chatgate.store.base import StoreError, TurnRow
from chatgate.store.sqlite import SQLiteStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "memory.db")
    s.migrate()
    yield s
    s.close()


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def turn(*ids: str, payload: str = "because") -> Turn:
    return Turn(ids, tuple(f"tool_{i}" for i in ids), payload)


def test_a_caller_recalls_its_own_turns_only(store: SQLiteStore) -> None:
    memory = TurnMemory(store, 60, 1 << 20)
    run(memory.remember("fp-a", "chat", turn("c1", "c2")))
    got = run(memory.recall("fp-a", "chat", ["c1", "c2", "c3"]))
    assert isinstance(got, dict) and sorted(got) == ["c1", "c2"]
    assert got["c1"].turn == got["c2"].turn and got["c1"].names == "tool_c1,tool_c2"
    assert run(memory.recall("fp-b", "chat", ["c1", "c2"])) == {}
    assert run(memory.recall("fp-a", "anthropic", ["c1"])) == {}


def test_another_process_recalls_through_the_store(store: SQLiteStore, tmp_path: Path) -> None:
    run(TurnMemory(store, 60, 1 << 20).remember("fp-a", "chat", turn("c1", payload="shared")))
    other = SQLiteStore(tmp_path / "memory.db")
    try:
        fresh = TurnMemory(other, 60, 1 << 20)  # an empty cache: another replica, or after a restart
        got = run(fresh.recall("fp-a", "chat", ["c1"]))
        assert isinstance(got, dict) and got["c1"].payload == "shared"
        assert fresh.cached_entries == 1, "what the store gave is cached"
    finally:
        other.close()


def test_turns_expire_and_are_purged_from_cache_and_store(store: SQLiteStore) -> None:
    clock = Clock()
    memory = TurnMemory(store, 60, 1 << 20, clock=clock)
    run(memory.remember("fp-a", "chat", turn("c1")))
    clock.now += 59
    assert "c1" in run(memory.recall("fp-a", "chat", ["c1"]))  # type: ignore[operator]
    clock.now += 2
    assert run(memory.recall("fp-a", "chat", ["c1"])) == {}
    assert run(memory.purge()) == 1
    assert memory.cached_entries == 0 and memory.cached_bytes == 0
    assert store.recall_turns("fp-a", "chat", ["c1"], 0) == []


def test_the_cache_is_bounded_in_bytes_drops_the_oldest_and_keeps_what_is_used() -> None:
    probe = TurnMemory(None, 60, 1 << 20)
    run(probe.remember("fp-a", "chat", turn("c0", payload="x" * 1000)))
    size = probe.cached_bytes
    assert size > 1000
    memory = TurnMemory(None, 60, (4 * size) * 8 // 7 + 8)  # a ring of four such turns (1/8 is the table)
    for n in range(4):
        run(memory.remember("fp-a", "chat", turn(f"c{n}", payload="x" * 1000)))
    run(memory.recall("fp-a", "chat", ["c0"]))  # c0 is used: written again, it is now the newest
    run(memory.remember("fp-a", "chat", turn("c4", payload="y" * 1000)))
    assert memory.cached_bytes <= 4 * size and memory.cached_entries == 4
    got = run(memory.recall("fp-a", "chat", ["c0", "c1", "c2", "c3", "c4"]))
    assert isinstance(got, dict) and sorted(got) == ["c0", "c2", "c3", "c4"]
    run(memory.remember("fp-a", "chat", turn("huge", payload="z" * 10 * size)))  # larger than the bound
    assert memory.cached_bytes <= 4 * size
    assert run(memory.recall("fp-a", "chat", ["huge"])) == {}


def test_duplicate_ids_in_one_turn_are_not_remembered() -> None:
    memory = TurnMemory(None, 60, 1 << 20)
    run(memory.remember("fp-a", "chat", turn("c1", "c1")))
    assert memory.cached_entries == 0


class BrokenStore(SQLiteStore):
    def try_remember_turns(self, rows: object) -> bool:
        raise StoreError("database is locked")

    def remember_turns(self, rows: object) -> None:
        raise StoreError("database is locked")

    def recall_turns(self, caller: str, kind: str, call_ids: object, now: float) -> list:  # type: ignore[type-arg]
        raise StoreError("database is locked")

    def purge_turns(self, now: float) -> int:
        raise StoreError("database is locked")


def test_a_failing_store_leaves_this_process_its_memory(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    broken = BrokenStore(tmp_path / "broken.db")
    memory = TurnMemory(broken, 60, 1 << 20)
    run(memory.remember("fp-a", "chat", turn("c1", payload="secret reasoning")))
    assert "c1" in run(memory.recall("fp-a", "chat", ["c1"]))  # type: ignore[operator]
    assert run(memory.recall("fp-a", "chat", ["c2"])) == {}
    assert run(memory.purge()) == 0
    assert memory.store_errors == 2
    assert "secret reasoning" not in caplog.text, "the reasoning itself is never logged"
    broken.close()


def test_the_cache_holds_no_python_object_per_turn() -> None:
    """repair.reasoning_cache_bytes bounds the real memory: the turns live in the cache's ring (an anonymous
    map of that size, less the table's share), and the Python heap does not grow with them (tracemalloc)."""
    async def fill(memory: TurnMemory, prefix: str) -> None:
        for n in range(4000):
            await memory.remember(f"fp-{n % 7}", "chat", turn(f"{prefix}_{n:08d}",
                                                             payload=f"reasoning {n} " + "r" * 900))

    memory = TurnMemory(None, 60, 64 << 20)
    run(fill(memory, "first"))
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        run(fill(memory, "second"))  # 4,000 more turns, all of them kept
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    blocks = sum(stat.count_diff for stat in after.compare_to(before, "filename"))
    assert memory.cached_entries == 8000
    assert 8000 * 900 < memory.cached_bytes <= 64 << 20
    assert blocks < 100, f"{blocks} more Python memory blocks held for 4,000 more turns"  # the table: 1


class CountingStore(SQLiteStore):
    calls: list[int]

    def try_remember_turns(self, rows: Sequence[TurnRow]) -> bool:
        return False  # always through a worker thread, where batches form

    def remember_turns(self, rows: Sequence[TurnRow]) -> None:
        self.calls.append(len(rows))
        time.sleep(0.02)  # a commit that takes a while: turns relayed meanwhile queue up
        super().remember_turns(rows)


def test_turns_relayed_together_are_stored_together_and_each_waits_for_its_commit(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "batch.db")
    store.migrate()
    store.calls = []
    memory = TurnMemory(store, 60, 1 << 20)

    async def one(n: int) -> bool:
        await memory.remember("fp-a", "chat", turn(f"c{n}"))
        return bool(store.recall_turns("fp-a", "chat", [f"c{n}"], 0))  # in the store when remember returns

    async def main() -> list[bool]:
        return await asyncio.gather(*(one(n) for n in range(16)))

    try:
        assert run(main()) == [True] * 16
        assert sum(store.calls) == 16 and len(store.calls) < 16, store.calls
    finally:
        store.close()


def test_with_a_ring_file_a_turn_is_written_nowhere_else_and_recalled_after_a_restart(
        store: SQLiteStore, tmp_path: Path) -> None:
    """Where this process is the store's only user, the cache's ring file is the turn's durable copy: the
    store gets nothing, and the next process on the file recalls the turn."""
    clock = Clock()
    ring = str(tmp_path / "turns.ring")
    memory = TurnMemory(store, 60, 1 << 20, clock=clock, ring_path=ring)
    assert memory.durable
    run(memory.remember("fp-a", "chat", turn("c1", "c2", payload="why")))
    assert store.recall_turns("fp-a", "chat", ["c1", "c2"], 0) == []
    memory.close()
    again = TurnMemory(store, 60, 1 << 20, clock=clock, ring_path=ring)
    got = run(again.recall("fp-a", "chat", ["c1", "c2"]))
    assert isinstance(got, dict) and got["c1"].payload == "why" and got["c1"].turn == got["c2"].turn
    assert run(again.recall("fp-b", "chat", ["c1"])) == {}, "another caller's"
    clock.now += 61
    assert run(again.recall("fp-a", "chat", ["c1"])) == {}, "expired"
    again.close()


def test_a_ring_file_another_process_holds_sends_the_turns_to_the_store(store: SQLiteStore,
                                                                       tmp_path: Path) -> None:
    ring = str(tmp_path / "turns.ring")
    holder = TurnMemory(store, 60, 1 << 20, ring_path=ring)
    other = TurnMemory(store, 60, 1 << 20, ring_path=ring)
    assert holder.durable and not other.durable
    run(other.remember("fp-a", "chat", turn("c1", payload="why")))
    assert [r.payload for r in store.recall_turns("fp-a", "chat", ["c1"], 0)] == ["why"]
    got = run(holder.recall("fp-a", "chat", ["c1"]))  # not in its cache: found in the store
    assert isinstance(got, dict) and got["c1"].payload == "why"
    holder.close()
    other.close()


def test_without_a_cache_a_ring_file_is_not_used_and_turns_go_to_the_store(store: SQLiteStore,
                                                                          tmp_path: Path) -> None:
    memory = TurnMemory(store, 60, 0, ring_path=str(tmp_path / "turns.ring"))
    assert not memory.durable
    run(memory.remember("fp-a", "chat", turn("c1", payload="why")))
    assert [r.payload for r in store.recall_turns("fp-a", "chat", ["c1"], 0)] == ["why"]


def test_one_tenant_cannot_push_anothers_turns_out_of_the_cache() -> None:
    """Issue 48: 140 large tool-call turns of team B turned team A's repair into a 400. Each tenant has a fair
    share of the ring (the ring divided by the tenants in it); B's turns beyond its share stay out of it."""
    memory = TurnMemory(None, 60, 1 << 20)
    run(memory.remember("key-a", "chat", turn("a1", payload="the reasoning of team A"), "team-a"))
    for n in range(140):
        run(memory.remember("key-b", "chat", turn(f"b{n}", payload="r" * 20_000), "team-b"))
    assert run(memory.recall("key-a", "chat", ["a1"])) != {}, "team A's turn is still remembered"
    kept = run(memory.recall("key-b", "chat", [f"b{n}" for n in range(140)]))
    assert isinstance(kept, dict) and 10 <= len(kept) < 140  # B keeps its share: the first of its turns
    assert memory.over_share > 0


def test_a_tenant_alone_has_the_whole_cache() -> None:
    memory = TurnMemory(None, 60, 1 << 20)
    for n in range(40):
        run(memory.remember("key-b", "chat", turn(f"b{n}", payload="r" * 20_000), "team-b"))
    assert len(run(memory.recall("key-b", "chat", [f"b{n}" for n in range(40)]))) == 40  # type: ignore[arg-type]
    assert memory.over_share == 0


def test_turns_over_a_share_go_to_the_store(store: SQLiteStore, tmp_path: Path) -> None:
    """With a store, a turn over its tenant's share is still remembered, there (the durable ring of a
    single process included)."""
    memory = TurnMemory(store, 60, 1 << 20, ring_path=str(tmp_path / "turns.ring"))
    assert memory.durable
    run(memory.remember("key-a", "chat", turn("a1"), "team-a"))
    for n in range(140):
        run(memory.remember("key-b", "chat", turn(f"b{n}", payload="r" * 20_000), "team-b"))
    got = run(memory.recall("key-b", "chat", [f"b{n}" for n in range(140)]))
    assert isinstance(got, dict) and len(got) == 140
    assert run(memory.recall("key-a", "chat", ["a1"])) != {}
    memory.close()
