"""The cache of relayed turns: records in a ring of bytes, found through a table of positions.

A full cache holds tens of thousands of turns for hours. Kept as Python objects (a dict entry, a key tuple,
a few strings and a float each), they slowed every request of the process by about 5%, those that never
touch the cache too, measured side by side (bench scenario 11): long-lived small objects scattered through
the allocator's pools cost the short-lived ones of each request their locality. Here a turn is one record
in a memory map, and the index is two arrays of integers: the cache holds no Python object per turn.

The map is anonymous, or a file this process alone maps (`path`; locked while it is open). A file is the
turn memory of a process that is the store's only user: a record is in the OS page cache once `put`
returns, so it survives `kill -9`, and the next process on that file finds it. Each record carries its
position in the ring and a CRC of its bytes, which is all a process needs to find the live records again
(`_recover`): a record torn by a crash, or one the ring has partly overwritten, fails its check.

The ring is written in order; a record is live while the bytes after it written since are fewer than the
ring's size, so the oldest records are the first to go (a record read back from the older half of the ring
is written again at its end: what is used stays). The table uses open addressing with linear probing over
record positions, each slot with its key's hash beside it (so a probe reads no other record's key); a
slot whose record was overwritten or purged is reused. The table is rebuilt from the
live records when half of it is taken. A replaced or moved record is zeroed at once; each purge zeroes the
expired ones and what the ring left of records it partly overwrote, so between purges only live turns and
such remains are in memory, and after one only live, unexpired turns.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import sys
import zlib
from array import array
from collections.abc import Iterator

# magic, CRC-32 of the record's text (0 in an anonymous map), its position in the ring, expires_at, then
# the lengths of key, turn, names, payload (UTF-8)
_HEAD = struct.Struct("<4sIqdIIII")
MAGIC = b"CGt\x01"
EMPTY, DELETED = -1, -2
MIN_SLOTS = 1024
TABLE_SHARE = 8  # the table takes at most 1/8 of the bound, the ring the rest
# Linux 5.14+: fault a range of the map in, writable, in one call. The pages ahead of the write head are
# made ready a chunk at a time: a put then never stops for a page fault (one in every two or three puts
# otherwise, and again each lap on a file, whose pages are clean once written back).
MADV_POPULATE_WRITE = 23
READY_CHUNK = 512 * 1024


class RingInUse(OSError):
    """Another live process maps this ring file."""


class TurnCache:
    def __init__(self, max_bytes: int, path: str | os.PathLike[str] | None = None, now: float = 0.0) -> None:
        self.max_bytes = max_bytes
        self.size = max_bytes - max_bytes // TABLE_SHARE  # the ring
        self.max_slots = max(MIN_SLOTS, _pow2_at_most(max_bytes // TABLE_SHARE // 16))  # 8+8 bytes a slot
        self._fd = -1
        self._end = 0  # the ring's write position, counted from its start (it only grows)
        self._floor = 0  # records before this position are gone, even where not yet overwritten
        self._slots = array("q", [EMPTY]) * MIN_SLOTS
        self._tags = array("q", [0]) * MIN_SLOTS  # each slot's key hash
        self._mask = MIN_SLOTS - 1
        self._taken = 0  # slots not EMPTY
        self._cleared_at = 0  # the write position when the dead bytes were last cleared
        self._ready = 0  # the pages before this write position are faulted in, writable
        self._populates = sys.platform == "linux"
        self._ring: mmap.mmap | None = None
        if self.size <= 0:
            return
        if path is None:
            self._ring = mmap.mmap(-1, self.size)  # its pages are touched as used
            return
        kept = self._open(os.fspath(path), now)
        for key, turn, names, payload, expires in kept:  # from a file of another size, oldest first
            self.put(key, turn, names, payload, expires)

    @property
    def durable(self) -> bool:
        return self._fd >= 0

    @property
    def written(self) -> int:
        """Bytes written to the ring since it was made: a record is live while fewer than `size` follow it."""
        return self._end

    def close(self) -> None:
        """Write a file's pages out and let it go (its lock with it)."""
        if self._ring is not None:
            if self._fd >= 0:
                self._ring.flush()
            self._ring.close()
            self._ring = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _live_from(self) -> int:
        return max(self._end - self.size, self._floor)

    def get(self, key: str, now: float) -> tuple[str, str, str, float] | None:
        """(turn, names, payload, expires_at) of the unexpired record of `key`."""
        found = self._find(key.encode("utf-8", "surrogatepass"))
        if found is None:
            return None
        slot, position = found
        ring = self._ring
        assert ring is not None
        _, turn, names, payload, expires = _read(ring, position % self.size)
        if expires <= now:
            return None
        if position < self._end - self.size // 2:  # in the older half: keep it by writing it again
            self._erase(slot, position)  # no stale copy of the reasoning is left behind
            self.put(key, turn, names, payload, expires)
        return turn, names, payload, expires

    def put(self, key: str, turn: str, names: str, payload: str, expires_at: float) -> None:
        text = key + turn + names + payload
        data = text.encode("utf-8", "surrogatepass")  # a client's ids may hold lone surrogates
        if len(data) == len(text):  # ASCII (DeepSeek's ids, and most tool names): one encoding for all
            klen, tlen, nlen, plen = len(key), len(turn), len(names), len(payload)
        else:
            klen, tlen, nlen, plen = [len(part.encode("utf-8", "surrogatepass"))
                                      for part in (key, turn, names, payload)]
        length = _HEAD.size + len(data)
        ring, size = self._ring, self.size
        if ring is None or length > size:
            self.delete(key)
            return
        at = self._end % size
        if at + length > size:  # a record never wraps: the ring's tail is skipped, and cleared
            ring[at:size] = bytes(size - at)
            self._end += size - at
            at = 0
        position = self._end
        if position + length > self._ready and self._populates:
            self._make_ready(ring, at, length)
        # the head goes first: a crash between the two writes leaves a record whose CRC fails
        _HEAD.pack_into(ring, at, MAGIC, zlib.crc32(data) if self._fd >= 0 else 0, position, expires_at,
                        klen, tlen, nlen, plen)
        ring[at + _HEAD.size:at + length] = data
        self._end += length
        self._index(data[:klen], position)

    def _make_ready(self, ring: mmap.mmap, at: int, length: int) -> None:
        start = at - at % mmap.PAGESIZE
        stop = min(self.size, max(start + READY_CHUNK, at + length))
        try:
            _populate(ring, start, stop - start)
        except (OSError, ValueError):  # an older kernel: the pages are faulted in as they are written
            self._populates = False
            return
        self._ready = self._end + (stop - at)

    def delete(self, key: str) -> None:
        found = self._find(key.encode("utf-8", "surrogatepass"))
        if found is not None:
            self._erase(found[0], found[1])

    def purge(self, now: float) -> int:
        """Erase the expired records, and clear what is left of records the ring has partly overwritten:
        afterwards the map holds live, unexpired reasoning only. How many records expired."""
        ring = self._ring
        if ring is None:
            return 0
        gone, live, oldest = 0, self._live_from(), self._end
        for slot, position in enumerate(self._slots):
            if position >= live:
                if _HEAD.unpack_from(ring, position % self.size)[3] <= now:
                    self._erase(slot, position)
                    gone += 1
                elif position < oldest:
                    oldest = position
        if self._end != self._cleared_at:  # only the ring's advance leaves such remains (erasing clears)
            self._clear_dead(oldest)
        return gone

    def _clear_dead(self, oldest: int) -> None:
        """Zero the bytes from the write head to the oldest live record (where the ring has been)."""
        assert self._ring is not None
        written = min(self._end, self.size)
        head, stop = self._end % self.size, oldest % self.size
        if oldest == self._end:  # nothing live
            spans = [(0, written)]
        elif head < stop:
            spans = [(head, stop)]
        elif head > stop:
            spans = [(head, written), (0, stop)]
        else:
            spans = []
        for start, end in spans:
            if end > start:
                self._ring[start:end] = bytes(end - start)
        self._cleared_at = self._end

    def entries(self) -> int:
        live = self._live_from()
        return sum(1 for position in self._slots if position >= live)

    def held_bytes(self) -> int:
        """The bytes of the live records (the ring itself is at most `size`)."""
        if self._ring is None:
            return 0
        live, total = self._live_from(), 0
        for position in self._slots:
            if position >= live:
                total += _length(self._ring, position % self.size)
        return total

    # --- the file ----------------------------------------------------------------------

    def _open(self, path: str, now: float) -> list[tuple[str, str, str, str, float]]:
        """Map the ring file, locked, and index the live records its last process left (what a file of
        another size held is returned instead, to be put again)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RingInUse(f"{path} is in use by another process") from None
        try:
            have = os.fstat(fd).st_size
            kept = []
            if have not in (0, self.size):
                with mmap.mmap(fd, have) as old:
                    kept = [_read(old, at) for _, at in _live_records(old, have)]
                os.ftruncate(fd, 0)
            os.ftruncate(fd, self.size)  # a sparse file: its pages are allocated as the ring reaches them
            self._ring = mmap.mmap(fd, self.size)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        if have == self.size:
            self._recover(now)
        return [record for record in kept if record[4] > now]

    def _recover(self, now: float) -> None:
        """Index the live records of the ring as its last process left it; the expired ones are erased, and
        the next purge clears what is left of the others (`_cleared_at`)."""
        ring = self._ring
        assert ring is not None
        live = _live_records(ring, self.size)
        if live:
            position, at = live[-1]
            self._end = position + _length(ring, at)
        for position, at in live:
            if _HEAD.unpack_from(ring, at)[3] <= now:
                length = _length(ring, at)
                ring[at:at + length] = bytes(length)
            else:
                self._index(_key_bytes(ring, at), position)
        self._cleared_at = -1

    # --- the table ---------------------------------------------------------------------

    def _key_at(self, position: int) -> bytes:
        assert self._ring is not None
        return _key_bytes(self._ring, position % self.size)

    def _find(self, kb: bytes) -> tuple[int, int] | None:
        """(slot, position) of the live record of this key."""
        slots, tags, mask = self._slots, self._tags, self._mask
        live = self._end - self.size
        if live < self._floor:
            live = self._floor
        tag = hash(kb)
        i = tag & mask
        while True:
            position = slots[i]
            if position == EMPTY:
                return None
            # the tag (the key's hash) spares reading the keys of other records probed on the way
            if tags[i] == tag and position >= live and self._key_at(position) == kb:
                return i, position
            i = (i + 1) & mask

    def _index(self, kb: bytes, position: int) -> None:
        """Point the key's slot at its new record: the slot of its older record (whose bytes go), else the
        first free one on its probe path (empty, erased, or overwritten by the ring)."""
        if (self._taken + 1) * 2 > len(self._slots):
            self._rebuild()
        slots, tags, mask = self._slots, self._tags, self._mask
        live = self._end - self.size
        if live < self._floor:
            live = self._floor
        tag = hash(kb)
        i, free = tag & mask, -1
        while True:
            found = slots[i]
            if found == EMPTY:
                break
            if found < live:  # DELETED is below any position
                if free < 0:
                    free = i
            elif tags[i] == tag and self._key_at(found) == kb:
                self._erase(i, found)
                free = i
                break
            i = (i + 1) & mask
        if free < 0:
            free = i
            self._taken += 1
        slots[free] = position
        tags[free] = tag

    def _erase(self, slot: int, position: int) -> None:
        assert self._ring is not None
        at = position % self.size
        length = _length(self._ring, at)
        self._ring[at:at + length] = bytes(length)  # the reasoning is deleted, not only forgotten
        self._slots[slot] = DELETED

    def _rebuild(self) -> None:
        """A new table for the live records, at most an eighth full (the next rebuild, an O(table) pass on
        the event loop, is then as many puts away as there are slots); if they would fill more than a
        quarter of the largest table, the oldest go first (records so small that the table, not the ring,
        is what bounds the memory)."""
        floor = self._live_from()
        live = sorted(p for p in self._slots if p >= floor)
        while len(live) * 4 > self.max_slots:
            self._floor = live[len(live) // 2]
            live = live[len(live) // 2:]
        n = min(self.max_slots, max(MIN_SLOTS, _pow2_at_most(len(live) * 4) * 4))
        slots, tags, mask = array("q", [EMPTY]) * n, array("q", [0]) * n, n - 1
        for position in live:
            tag = hash(self._key_at(position))
            i = tag & mask
            while slots[i] != EMPTY:
                i = (i + 1) & mask
            slots[i] = position
            tags[i] = tag
        self._slots, self._tags, self._mask, self._taken = slots, tags, mask, len(live)


def _populate(ring: mmap.mmap, start: int, length: int) -> None:
    ring.madvise(MADV_POPULATE_WRITE, start, length)


def _length(ring: mmap.mmap, at: int) -> int:
    _, _, _, _, klen, tlen, nlen, plen = _HEAD.unpack_from(ring, at)
    return int(_HEAD.size + klen + tlen + nlen + plen)


def _key_bytes(ring: mmap.mmap, at: int) -> bytes:
    klen = _HEAD.unpack_from(ring, at)[4]
    return ring[at + _HEAD.size:at + _HEAD.size + klen]


def _read(ring: mmap.mmap, at: int) -> tuple[str, str, str, str, float]:
    """(key, turn, names, payload, expires_at) of the record at `at`."""
    _, _, _, expires, klen, tlen, nlen, plen = _HEAD.unpack_from(ring, at)
    start = at + _HEAD.size
    raw = ring[start:start + klen + tlen + nlen + plen]
    text = raw.decode("utf-8", "surrogatepass")
    if len(raw) == len(text):  # ASCII ids (as DeepSeek's are): cut the text, not the bytes
        cuts = (klen, klen + tlen, klen + tlen + nlen)
        return text[:cuts[0]], text[cuts[0]:cuts[1]], text[cuts[1]:cuts[2]], text[cuts[2]:], expires
    parts: list[str] = []
    offset = 0
    for n in (klen, tlen, nlen):
        parts.append(raw[offset:offset + n].decode("utf-8", "surrogatepass"))
        offset += n
    return parts[0], parts[1], parts[2], raw[offset:].decode("utf-8", "surrogatepass"), expires


def _records(ring: mmap.mmap, size: int) -> Iterator[tuple[int, int]]:
    """(position, place) of the intact records of a ring file: at a record's head, its position agrees
    with its place and its CRC with its bytes (a torn record, or one partly overwritten, fails)."""
    at = ring.find(MAGIC)
    while at >= 0 and at + _HEAD.size <= size:
        _, crc, position, _, klen, tlen, nlen, plen = _HEAD.unpack_from(ring, at)
        end = at + _HEAD.size + klen + tlen + nlen + plen
        if position >= 0 and position % size == at and end <= size \
                and zlib.crc32(ring[at + _HEAD.size:end]) == crc:
            yield position, at
            at = ring.find(MAGIC, end)
        else:
            at = ring.find(MAGIC, at + 1)


def _live_records(ring: mmap.mmap, size: int) -> list[tuple[int, int]]:
    """(position, place) of the live records of a ring file, oldest first: the newest tells where the ring
    was written to, and those within its size back from there are live."""
    found = sorted(_records(ring, size))
    if not found:
        return []
    end = found[-1][0] + _length(ring, found[-1][1])
    return [(position, at) for position, at in found if position >= end - size]


def _pow2_at_most(n: int) -> int:
    return 1 << max(n.bit_length() - 1, 0)
