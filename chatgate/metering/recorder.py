"""Usage records: spooled to a local append-only file at once, written to the store in batches.

The request path calls `record()`: one `os.write` of a JSON line (survives `kill -9`: the bytes are in the
OS page cache) and a list append. A writer thread takes the whole list every `flush_interval` and writes it
to the store in batches (group commit), retrying while the store is down; the spool is truncated once
everything in it is stored. During a long outage at most `queue_max` items wait in memory: what comes after
them is only in the spool, and the writer reads it back from there once the store takes writes again.
On start, before anything is served, spool files left by dead processes are replayed (inserts are
idempotent: by record_id; the relayed tool-call turns that earlier versions spooled, by caller and call
id). Spool file names carry a fingerprint of the store they were meant for, so a spool directory shared by
processes (or a `chatgate usage --store OTHER`) never replays records into the wrong store. A live process
holds its spool file's lock; a file gets its spool name only once it is locked, so a replay never takes a
starting process's file for a dead one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from chatgate.store.base import Store, StoreError, StoreRefused, TurnRow, UsageRecord

log = logging.getLogger("chatgate.recorder")

SPOOL_TRUNCATE_AT = 1 << 20
QUEUE_MAX = 100_000  # items held in memory for the writer; beyond, the spool alone holds them
CATCH_UP_READ = 4 << 20  # bytes of spool read at a time when catching up


def encode(record: UsageRecord) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)


def store_tag(store: Store) -> str:
    """A short fingerprint of where the records go (SQLite: the resolved file; else the URL)."""
    path = getattr(store, "path", None)
    where = str(Path(path).resolve()) if path is not None else str(getattr(store, "url", ""))
    return hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def decode(line: bytes) -> UsageRecord | TurnRow | None:
    try:
        data = orjson.loads(line)
        if isinstance(data, dict) and "turn" in data:
            return TurnRow(*data["turn"])
        return UsageRecord(**data)
    except (orjson.JSONDecodeError, TypeError):
        return None  # a line torn by a crash mid-write


def _split(items: list[UsageRecord | TurnRow]) -> tuple[list[UsageRecord], list[TurnRow]]:
    usage = [x for x in items if isinstance(x, UsageRecord)]
    return usage, [x for x in items if isinstance(x, TurnRow)] if len(usage) < len(items) else []


class Recorder:
    def __init__(self, store: Store, spool_dir: str, batch_max: int = 500, flush_interval: float = 0.02,
                 retry_seconds: float = 1.0, truncate_at: int = SPOOL_TRUNCATE_AT,
                 queue_max: int = QUEUE_MAX) -> None:
        self.store = store
        self.spool_dir = Path(spool_dir)
        self.batch_max = batch_max
        self.flush_interval = flush_interval
        self.retry_seconds = retry_seconds
        self.truncate_at = truncate_at
        self.queue_max = queue_max
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._queued: list[UsageRecord] = []  # spooled, not yet taken by the writer
        self._stopping = False
        self._pending = 0  # spooled, not yet in the store
        self._spooled = 0  # items spooled since the start
        self._settled = 0  # of those, the ones written or dropped
        self._spilled_at: int | None = None  # spool offset from which lines are not queued (queue was full)
        self._fd = -1
        self._thread: threading.Thread | None = None
        self._path = Path()
        self._orphans_left = True
        self._tag = store_tag(store)
        self.last_error: str | None = None
        self.written = 0  # records the store took
        self.dropped = 0  # records the store refused (logged whole, then dropped: they cannot be written)

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Replays what dead processes left, then starts the writer."""
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self._replay_orphans()
        path = self.spool_dir / f"spool-{self._tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        # Locked before it has a name a replay takes for an orphan's.
        creating = path.with_name(f".tmp-{path.name}")
        self._fd = os.open(creating, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(creating, path)
        self._path = path
        self._thread = threading.Thread(target=self._run, name="chatgate-usage-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Flush what is queued; True when every record reached the store (else it stays spooled)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():  # still in a store call: its spool stays open (and locked) for it
                return False
        flushed = self._pending == 0
        if self._fd >= 0:
            if flushed:
                with contextlib.suppress(OSError):
                    self._path.unlink()
            os.close(self._fd)
            self._fd = -1
        return flushed

    # --- request path -------------------------------------------------------------

    def record(self, record: UsageRecord) -> None:
        self._spool(encode(record), (record,))

    def _spool(self, lines: bytes, items: Sequence[UsageRecord]) -> None:
        with self._lock:
            self._pending += len(items)
            self._spooled += len(items)
            first = not self._queued
            if self._spilled_at is None and len(self._queued) >= self.queue_max:
                self._spilled_at = os.fstat(self._fd).st_size
            os.write(self._fd, lines)
            if self._spilled_at is None:
                self._queued.extend(items)
        if first:
            self._wake.set()

    async def caught_up(self, timeout: float = 2.0) -> bool:
        """Wait until every record spooled before the call is in the store (or dropped): what a report read
        next shows them. False after `timeout` (the store is down, say: they stay spooled)."""
        target = self._spooled
        deadline = time.monotonic() + timeout
        while self._settled < target:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def healthy(self) -> bool:
        return self.last_error is None

    # --- writer thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            woken = self._wake.wait()
            if woken and not self._stopping:
                time.sleep(self.flush_interval)  # let a batch gather: one commit for many requests
            with self._lock:
                taken, self._queued = self._queued, []
                self._wake.clear()
            self._write_all(taken)
            if self._spilled_at is not None and self.last_error is None and not self._stopping:
                self._catch_up()
            if taken and self._orphans_left and self.last_error is None:
                self._replay_orphans()
            if self._stopping and not self._queued:
                return

    def _write_all(self, records: list[UsageRecord]) -> None:
        for start in range(0, len(records), self.batch_max):
            self._write(records[start:start + self.batch_max])

    def _catch_up(self) -> None:
        """Write what the spool alone holds (spooled while the queue was full), reading it back in pieces;
        new items are queued again meanwhile. If the store fails again, what is left stays spooled (and
        counted as pending) for the next start's replay."""
        with self._lock:
            assert self._spilled_at is not None
            start, end = self._spilled_at, os.fstat(self._fd).st_size
            self._spilled_at = None
        rest = b""
        while start < end and not self._stopping:
            data = rest + os.pread(self._fd, min(CATCH_UP_READ, end - start), start)
            start += len(data) - len(rest)
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            self._write_all([x for x in map(decode, data[:cut].splitlines()) if isinstance(x, UsageRecord)])

    def _stored(self, write: Callable[[], None]) -> bool:
        """Run `write` until the store takes it (True), retrying while the store is down; False if the
        recorder stops meanwhile (what was not written stays spooled). Other errors, and data the store
        refuses (StoreRefused), propagate."""
        while True:
            try:
                write()
            except StoreRefused:
                raise
            except StoreError as exc:
                # /readyz shows last_error to anyone: the store's own text (hosts, users) goes to the log only
                self.last_error = f"usage store unavailable: {type(exc).__name__} (details in the log)"
                log.warning("usage store unavailable: %s: %s; %d record(s) held in the spool",
                            type(exc).__name__, exc, self._pending)
                if self._stopping:
                    return False
                time.sleep(self.retry_seconds)
                continue
            self.last_error = None
            return True

    def _write(self, batch: list[UsageRecord]) -> None:
        try:
            if not self._stored(lambda: self.store.insert_usage(batch)):
                return
        except Exception as exc:  # a record the store cannot take: never let it block the others
            if len(batch) > 1:
                for record in batch:
                    self._write([record])
                return
            self._drop(batch, exc)
            self._settle(1)
            return
        self.written += len(batch)
        self._settle(len(batch))

    def _drop(self, items: Sequence[UsageRecord | TurnRow], exc: Exception) -> None:
        """Log what the store refused: a usage record whole (counted as dropped), a relayed turn by its call
        id (the reasoning itself is never logged)."""
        why = f"{type(exc).__name__}: {exc}"
        usage, turns = _split(list(items))
        for record in usage:
            log.error("usage record dropped, the store refused it (%s): %s", why, encode(record).decode())
        self.dropped += len(usage)
        if turns:
            log.error("%d relayed turn(s) dropped, the store refused them (%s); calls %s", len(turns), why,
                      ", ".join(r.call_id for r in turns))

    def _settle(self, n: int) -> None:
        with self._lock:
            self._pending -= n
            self._settled += n
            if self._pending == 0 and os.fstat(self._fd).st_size > self.truncate_at:
                os.ftruncate(self._fd, 0)

    def _replay_orphans(self) -> None:
        self._orphans_left = False
        for path in sorted(self.spool_dir.glob(f"spool-{self._tag}-*.jsonl")):
            if path == self._path:
                continue
            with contextlib.suppress(OSError):
                self._replay(path)
        for path in self.spool_dir.glob(f".tmp-spool-{self._tag}-*.jsonl"):
            with contextlib.suppress(OSError):
                _remove_unborn(path)

    def _replay(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by a live process: not an orphan
            # Between the open and the lock, another replay or the owner's clean stop may have removed it.
            orphan = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            orphan = False
        if not orphan:
            os.close(fd)
            return
        try:
            items = [x for x in map(decode, Path(path).read_bytes().splitlines()) if x is not None]
            records, turns = _split(items)
            for start in range(0, len(records), self.batch_max):
                self._replay_batch(self.store.insert_usage, records[start:start + self.batch_max])
            now = time.time()
            turns = [t for t in turns if t.expires_at > now]
            for start in range(0, len(turns), self.batch_max):
                self._replay_batch(self.store.remember_turns, turns[start:start + self.batch_max])
            path.unlink()
            if items:
                log.info("replayed %d usage record(s) and %d relayed turn(s) from %s", len(records),
                         len(turns), path.name)
        except Exception as exc:
            self._orphans_left = True
            self.last_error = (f"usage store unavailable while replaying {path.name}: {type(exc).__name__} "
                               "(details in the log)")
            log.warning("could not replay %s (kept for the next try): %s: %s", path.name, type(exc).__name__,
                        exc)
        finally:
            os.close(fd)

    def _replay_batch(self, insert: Callable[[Any], None], items: list[Any]) -> None:
        """Insert replayed items; if the store refuses something (StoreRefused: retrying cannot help), each
        item alone, dropping what it refuses, so one such line does not keep a spool file unreplayed."""
        try:
            insert(items)
        except StoreRefused as exc:
            if len(items) == 1:
                self._drop(items, exc)
                return
            for item in items:
                self._replay_batch(insert, [item])


def _remove_unborn(path: Path) -> None:
    """A spool file whose process was killed (`kill -9`) before it could name it: nothing was ever written to
    it. One younger than a minute may be a starting process's, between its creation and its lock."""
    stat = path.stat()
    if stat.st_size == 0 and stat.st_mtime < time.time() - 60:
        path.unlink()


def replay_spools(store: Store, spool_dir: str) -> None:
    """Write records left in spool files by dead processes (used by the CLI before reporting); a spool
    directory that is not there holds none, and is not created."""
    if not Path(spool_dir).is_dir():
        return
    recorder = Recorder(store, spool_dir)
    recorder.spool_dir.mkdir(parents=True, exist_ok=True)
    recorder._replay_orphans()  # it owns no spool file, so every matching unlocked one is an orphan
