"""chatgate's ids (chatgate/ids.py): 128 random bits each, unique across threads, from pages of os.urandom."""

from __future__ import annotations

import threading

from chatgate.ids import new_id, ordered_id


def test_ids_are_32_hex_characters_and_never_repeat_across_threads() -> None:
    made: list[list[str]] = [[] for _ in range(4)]

    def make(into: list[str]) -> None:
        into.extend(new_id() for _ in range(5_000))

    threads = [threading.Thread(target=make, args=(into,)) for into in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i for into in made for i in into]
    assert len(set(ids)) == len(ids) == 20_000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len({i[:8] for i in ids}) > 19_000, "no shared prefix: every id is random from its first byte"


def test_ordered_ids_sort_by_the_time_they_were_made_and_never_repeat() -> None:
    import time

    before = int(time.time() * 1000)
    made = [ordered_id() for _ in range(20_000)]
    after = int(time.time() * 1000)
    assert len(set(made)) == len(made)
    assert all(len(i) == 32 and before <= int(i[:12], 16) <= after for i in made)
    assert [i[:12] for i in made] == sorted(i[:12] for i in made)
    assert len({i[12:] for i in made}) == len(made), "the rest is random"
