"""chatgate.bounded.BoundedDict: never more than its size, the oldest (or least recently touched) out
first."""

from __future__ import annotations

import pytest

from chatgate.bounded import BoundedDict


def test_holds_at_most_its_size_dropping_the_oldest() -> None:
    d: BoundedDict[str, int] = BoundedDict(3)
    for i, k in enumerate("abcde"):
        d[k] = i
    assert list(d.items()) == [("c", 2), ("d", 3), ("e", 4)]
    assert len(d) == 3


def test_replacing_a_kept_key_drops_nothing() -> None:
    d: BoundedDict[str, int] = BoundedDict(2)
    d["a"], d["b"] = 1, 2
    d["a"] = 10
    assert dict(d) == {"a": 10, "b": 2}


def test_touch_keeps_what_is_used() -> None:
    d: BoundedDict[str, int] = BoundedDict(2)
    d["a"], d["b"] = 1, 2
    d.touch("a")
    d["c"] = 3
    assert dict(d) == {"a": 1, "c": 3}
    with pytest.raises(KeyError):
        d.touch("b")


def test_every_way_of_adding_is_bounded() -> None:
    d: BoundedDict[int, int] = BoundedDict(4)
    d.update((i, i) for i in range(10))
    assert list(d) == [6, 7, 8, 9]
    assert d.setdefault(20, 1) == 1 and d.setdefault(20, 2) == 1
    made: list[int] = []

    def make(k: int) -> int:
        made.append(k)
        return k * k

    assert d.get_or_make(5, make) == 25 and d.get_or_make(5, make) == 25
    assert made == [5] and list(d) == [8, 9, 20, 5]


def test_size_is_at_least_one() -> None:
    with pytest.raises(ValueError):
        BoundedDict(0)
