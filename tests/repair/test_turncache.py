"""TurnCache without the gateway: a ring of records and a table of positions, bounded in bytes; in an
anonymous map, or in a file that the next process on it reads back."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chatgate.repair import turncache
from chatgate.repair.turncache import MIN_SLOTS, READY_CHUNK, RingInUse, TurnCache, _read


def test_a_record_comes_back_as_it_was_put() -> None:
    cache = TurnCache(1 << 20)
    cache.put("fp-a\x00chat\x00call_1", "t1", "get_weather,search", "思考 \ud800 reasoning", 100.0)
    assert cache.get("fp-a\x00chat\x00call_1", 50.0) == ("t1", "get_weather,search", "思考 \ud800 reasoning",
                                                         100.0)
    assert cache.get("fp-a\x00chat\x00call_2", 50.0) is None
    assert cache.get("fp-a\x00chat\x00call_1", 100.0) is None, "expired"
    assert cache.entries() == 1


def test_putting_a_key_again_replaces_its_record() -> None:
    cache = TurnCache(1 << 20)
    cache.put("k", "t1", "n", "old", 100.0)
    cache.put("k", "t2", "n", "new", 100.0)
    assert cache.get("k", 0.0) == ("t2", "n", "new", 100.0)
    assert cache.entries() == 1


def test_the_oldest_records_go_first_when_the_ring_is_full() -> None:
    cache = TurnCache(80_000)  # a ring of 70,000 bytes
    for n in range(100):
        cache.put(f"k{n}", "t", "n", "x" * 1000, 1e9)
    kept = [n for n in range(100) if cache.get(f"k{n}", 0.0) is not None]
    assert kept == list(range(100 - len(kept), 100)) and 60 <= len(kept) <= 69
    assert cache.held_bytes() <= cache.size
    cache.put("huge", "t", "n", "x" * 100_000, 1e9)  # larger than the ring: not cached
    assert cache.get("huge", 0.0) is None


def test_a_record_read_from_the_older_half_is_kept() -> None:
    cache = TurnCache(80_000)
    for n in range(60):
        cache.put(f"k{n}", "t", "n", "x" * 1000, 1e9)
    assert cache.get("k0", 0.0) is not None  # old: written again at the end of the ring
    for n in range(60, 100):
        cache.put(f"k{n}", "t", "n", "x" * 1000, 1e9)
    assert cache.get("k0", 0.0) is not None and cache.get("k1", 0.0) is None


def test_purge_erases_the_expired_records_bytes() -> None:
    cache = TurnCache(1 << 20)
    cache.put("a", "t", "n", "secret reasoning A", 10.0)
    cache.put("b", "t", "n", "secret reasoning B", 20.0)
    assert cache.purge(15.0) == 1
    assert cache.get("a", 0.0) is None and cache.get("b", 0.0) is not None
    ring = bytes(cache._ring[: cache._end])  # type: ignore[index]
    assert b"secret reasoning A" not in ring and b"secret reasoning B" in ring
    assert cache.entries() == 1
    cache.delete("b")
    assert cache.get("b", 0.0) is None and b"secret reasoning B" not in bytes(cache._ring[: cache._end])  # type: ignore[index]


def test_no_stale_copy_of_a_reasoning_stays_in_the_ring() -> None:
    """A key put again, and a record moved to the ring's end when read, leave no old bytes behind."""
    cache = TurnCache(80_000)
    cache.put("a", "t", "n", "first reasoning", 1e9)
    cache.put("a", "t", "n", "second reasoning", 1e9)
    for n in range(50):
        cache.put(f"k{n}", "t", "n", "x" * 1000, 1e9)
    cache.put("b", "t", "n", "moved reasoning", 1e9)
    for n in range(50, 60):
        cache.put(f"k{n}", "t", "n", "x" * 1000, 1e9)
    assert cache.get("a", 0.0) == ("t", "n", "second reasoning", 1e9)  # old: written again at the end
    ring = bytes(cache._ring[: cache.size])  # type: ignore[index]
    assert b"first reasoning" not in ring and ring.count(b"second reasoning") == 1
    assert cache.get("b", 0.0) is not None and ring.count(b"moved reasoning") == 1


@pytest.mark.parametrize("laps", [0.5, 1, 3.3])
def test_after_a_purge_the_ring_holds_only_what_the_cache_can_return(laps: float) -> None:
    """Records of several sizes, so that later ones skip the ring's tail and partly overwrite earlier ones;
    some expire. After a purge, every reasoning still in memory is a live, unexpired record."""
    cache, keys = TurnCache(8_000), []  # a ring of 7,000 bytes
    for _ in range(int(laps * 10)):
        for size, expires in ((500, 50.0), (1000, 1e9), (200, 1e9)):
            key = f"k{len(keys)}"
            cache.put(key, "t", "n", f"secret {key}:" + "x" * size, expires)
            keys.append(key)
    cache.purge(100.0)
    ring = bytes(cache._ring[: cache.size])  # type: ignore[index]
    present = [key for key in keys if f"secret {key}:".encode() in ring]
    assert present and all(cache._find(key.encode()) is not None for key in present), present
    assert all(cache.get(key, 100.0) is not None for key in present)


def test_many_small_records_keep_the_table_within_its_share_of_the_bound() -> None:
    cache = TurnCache(1 << 20)  # the table may take 128 KiB: 16,384 slots, a quarter of them after a rebuild
    for n in range(50_000):
        cache.put(f"k{n}", "t", "", "r", 1e9)
    assert len(cache._slots) * 8 <= (1 << 20) // 8
    assert cache.entries() <= cache.max_slots // 2
    assert cache.get("k49999", 0.0) is not None and cache.get("k0", 0.0) is None


def test_against_a_dict_model() -> None:
    """Random puts, gets, deletes and purges: whatever the cache returns is what was last put for that key,
    unexpired; and with a ring large enough for everything, it returns all of it."""
    rng = random.Random(7)
    for size in (5_000, 1 << 22):
        cache, model = TurnCache(size), {}
        for step in range(20_000):
            key = f"fp-{rng.randrange(5)}\x00chat\x00call_{rng.randrange(300)}"
            op = rng.random()
            if op < 0.5:
                value = (f"t{step}", "n", "r" * rng.randrange(0, 400), float(rng.randrange(50, 200)))
                cache.put(key, *value)
                model[key] = value
            elif op < 0.95:
                now = float(rng.randrange(0, 100))
                want = model.get(key)
                got = cache.get(key, now)
                if want is None or want[3] <= now:
                    assert got is None
                elif size > 1 << 20:
                    assert got == want
                else:
                    assert got in (None, want)
            elif op < 0.98:
                cache.delete(key)
                model.pop(key, None)
            else:
                now = float(rng.randrange(0, 100))
                cache.purge(now)
                model = {k: v for k, v in model.items() if v[3] > now}
        assert len(cache._slots) >= MIN_SLOTS


# --- a ring file: the durable turn memory of a process that is its store's only user -----------------


def test_a_ring_file_gives_its_records_to_the_next_cache_on_it(tmp_path: Path) -> None:
    path = tmp_path / "turns.ring"
    cache = TurnCache(1 << 20, path)
    assert cache.durable
    cache.put("fp-a\x00chat\x00call_1", "t1", "get_weather", "思考 \ud800 reasoning", 100.0)
    cache.put("fp-a\x00chat\x00call_2", "t2", "search", "second", 100.0)
    cache.put("fp-a\x00chat\x00call_1", "t3", "get_weather", "replaced", 100.0)
    cache.close()
    again = TurnCache(1 << 20, path, now=50.0)
    assert again.get("fp-a\x00chat\x00call_1", 50.0) == ("t3", "get_weather", "replaced", 100.0)
    assert again.get("fp-a\x00chat\x00call_2", 50.0) == ("t2", "search", "second", 100.0)
    assert again.entries() == 2
    again.put("fp-a\x00chat\x00call_3", "t4", "n", "after the restart", 100.0)  # written after the others
    again.close()
    third = TurnCache(1 << 20, path, now=50.0)
    assert [third.get(f"fp-a\x00chat\x00call_{n}", 50.0) is not None for n in (1, 2, 3)] == [True] * 3
    third.close()


def test_a_turn_put_survives_kill_9(tmp_path: Path) -> None:
    """No close, no flush: the process dies right after `put` returns, and the next one finds the turn."""
    path = tmp_path / "turns.ring"
    code = ("import os, signal, sys\n"
            "from chatgate.repair.turncache import TurnCache\n"
            "cache = TurnCache(1 << 20, sys.argv[1])\n"
            "for n in range(200):\n"
            "    cache.put(f'k{n}', 't', 'n', f'reasoning {n} ' * 20, 1e12)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], check=False)
    assert done.returncode == -signal.SIGKILL
    cache = TurnCache(1 << 20, path)
    assert all(cache.get(f"k{n}", 0.0) == ("t", "n", f"reasoning {n} " * 20, 1e12) for n in range(200))
    cache.close()


def test_one_process_at_a_time_maps_a_ring_file(tmp_path: Path) -> None:
    path = tmp_path / "turns.ring"
    first = TurnCache(1 << 20, path)
    with pytest.raises(RingInUse):
        TurnCache(1 << 20, path)
    first.close()
    TurnCache(1 << 20, path).close()  # free again once its holder let it go


def test_a_torn_record_is_skipped_and_the_others_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "turns.ring"
    cache = TurnCache(1 << 20, path)
    for n in range(3):
        cache.put(f"k{n}", "t", "n", f"reasoning {n}", 1e9)
    cache.close()
    data = bytearray(path.read_bytes())
    at = data.index(b"reasoning 1")
    data[at:at + 11] = b"REASONING 1"  # the bytes of a record half written when the power went
    path.write_bytes(bytes(data))
    again = TurnCache(1 << 20, path)
    assert again.get("k1", 0.0) is None
    assert again.get("k0", 0.0) is not None and again.get("k2", 0.0) is not None
    again.close()


def test_expired_records_are_erased_from_the_file_when_it_is_opened(tmp_path: Path) -> None:
    path = tmp_path / "turns.ring"
    cache = TurnCache(1 << 20, path)
    cache.put("a", "t", "n", "secret reasoning A", 10.0)
    cache.put("b", "t", "n", "secret reasoning B", 20.0)
    cache.close()
    again = TurnCache(1 << 20, path, now=15.0)
    assert again.get("a", 15.0) is None and again.get("b", 15.0) is not None
    again.close()
    data = path.read_bytes()
    assert b"secret reasoning A" not in data and b"secret reasoning B" in data


def test_purged_and_deleted_reasoning_leaves_the_file(tmp_path: Path) -> None:
    path = tmp_path / "turns.ring"
    cache = TurnCache(1 << 20, path)
    cache.put("a", "t", "n", "secret reasoning A", 10.0)
    cache.put("b", "t", "n", "secret reasoning B", 1e9)
    cache.purge(15.0)
    cache.delete("b")
    cache.close()
    data = path.read_bytes()
    assert b"secret reasoning" not in data


def test_a_ring_file_of_another_size_keeps_the_newest_records_that_fit(tmp_path: Path) -> None:
    path = tmp_path / "turns.ring"
    cache = TurnCache(1 << 20, path)
    for n in range(100):
        cache.put(f"k{n}", "t", "n", "x" * 1000, 1e9)
    cache.put("gone", "t", "n", "expired", 5.0)
    cache.close()
    smaller = TurnCache(40_000, path, now=10.0)  # a ring of 35,000 bytes: about 33 of them
    kept = [n for n in range(100) if smaller.get(f"k{n}", 10.0) is not None]
    assert kept == list(range(100 - len(kept), 100)) and 25 <= len(kept) <= 34
    assert smaller.get("gone", 0.0) is None
    smaller.close()
    assert path.stat().st_size == smaller.size


@pytest.mark.parametrize("laps", [0.3, 1, 2.7])
def test_after_laps_of_the_ring_a_reopened_file_returns_what_the_cache_returned(tmp_path: Path,
                                                                              laps: float) -> None:
    """Records of several sizes wrap the ring (skipping its tail, partly overwriting older ones), some are
    read back from the older half (moved), some deleted, some expire: the next cache on the file answers
    every key as the last one did."""
    rng = random.Random(11)
    path = tmp_path / "turns.ring"
    cache, keys = TurnCache(8_000, path), []
    for step in range(int(laps * 40)):
        key = f"fp-{step % 3}\x00chat\x00call_{step}"
        cache.put(key, f"t{step}", "n", f"reasoning {step}:" + "x" * rng.randrange(0, 600),
                  rng.choice((30.0, 1e9)))
        keys.append(key)
        if rng.random() < 0.3:
            cache.get(rng.choice(keys), 0.0)
        if rng.random() < 0.05:
            cache.delete(rng.choice(keys))
    before = {key: _peek(cache, key, 40.0) for key in keys}
    cache.close()
    again = TurnCache(8_000, path, now=40.0)
    assert {key: _peek(again, key, 40.0) for key in keys} == before
    assert any(v is not None for v in before.values())
    again.close()


def _peek(cache: TurnCache, key: str, now: float) -> tuple[str, str, str, float] | None:
    """What `get` returns, without moving a record read from the older half."""
    found = cache._find(key.encode("utf-8", "surrogatepass"))
    if found is None or cache._ring is None:
        return None
    _, turn, names, payload, expires = _read(cache._ring, found[1] % cache.size)
    return (turn, names, payload, expires) if expires > now else None


# --- the pages ahead of the write head are faulted in a chunk at a time ------------------------------


def _mapped_rss_kb(path: Path) -> int:
    """The resident KB of this process's mapping of `path` (/proc/self/smaps)."""
    rss, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split(" ", 1)[0] and line[0] in "0123456789abcdef":
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            rss += int(line.split()[1])
    return rss


@pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE is Linux's")
def test_a_put_makes_the_next_chunk_of_the_ring_resident(tmp_path: Path) -> None:
    path = tmp_path / "turns.ring"
    cache = TurnCache(8 << 20, path)
    cache.put("fp-a\x00chat\x00call_1", "t1", "n", "r", 100.0)
    # one record of a few dozen bytes, and the chunk after it is in memory, writable (no fault per page)
    assert _mapped_rss_kb(path) >= READY_CHUNK // 1024
    assert cache._ready >= READY_CHUNK
    for i in range(READY_CHUNK // 1000 * 3):  # past the first chunk: the next one is made ready
        cache.put(f"fp-a\x00chat\x00call_{i}", "t", "n", "x" * 900, 100.0)
    assert cache._ready > cache._end > 2 * READY_CHUNK
    assert _mapped_rss_kb(path) * 1024 >= cache._ready - 4096  # what is ready is resident, ahead of the head
    cache.close()


def test_without_madvise_populate_the_ring_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(ring: object, start: int, length: int) -> None:
        raise OSError(22, "Invalid argument")  # a kernel before 5.14

    monkeypatch.setattr(turncache, "_populate", refused)
    cache = TurnCache(1 << 20)
    cache._populates = True  # as on Linux
    for i in range(2000):
        cache.put(f"fp-a\x00chat\x00call_{i}", "t", "n", "x" * 900, 100.0)
    assert not cache._populates  # tried once, then left to the page faults
    assert cache.get("fp-a\x00chat\x00call_1999", 0.0) == ("t", "n", "x" * 900, 100.0)
