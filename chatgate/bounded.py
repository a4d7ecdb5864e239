"""A dict that holds at most so many entries: chatgate's small caches (what a name, a key or a label
set maps to), each bounded so that a client sending endless distinct values costs memory it cannot grow.

Reads are plain dict reads (`d[k]`, `d.get(k)`, `k in d`: no Python call). Adding a key to a full one drops
the entry added longest ago (first in, first out); `touch` moves a key to the young end, for a cache whose
entries live as long as they are used (least recently used out).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedDict(OrderedDict[K, V]):
    __slots__ = ("maxsize",)

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"a BoundedDict holds at least one entry, not {maxsize}")
        super().__init__()
        self.maxsize = maxsize

    def __setitem__(self, key: K, value: V) -> None:
        if len(self) >= self.maxsize and key not in self:
            self.popitem(last=False)
        super().__setitem__(key, value)

    def setdefault(self, key: K, default: V) -> V:
        if key in self:
            return self[key]
        self[key] = default
        return default

    def update(self, items: Iterable[tuple[K, V]] = (), /) -> None:  # type: ignore[override]
        for key, value in items:
            self[key] = value

    def get_or_make(self, key: K, make: Callable[[K], V]) -> V:
        """The value kept for `key`, made by `make(key)` and kept the first time it is asked for."""
        try:
            return self[key]
        except KeyError:
            value = self[key] = make(key)
            return value

    def touch(self, key: K) -> None:
        """`key` was used: the last to be dropped (a KeyError if it is not kept)."""
        self.move_to_end(key)
