"""The inspector's writer: refusals are handed over on the request path (a deque append), redacted and
written to the store by a thread in batches, as the usage recorder does; the store keeps each process's
last N and drops what is older than the TTL. A store that is down loses refusals (they are a diagnostic,
not a record: the usage record of the request is kept by the usage recorder), never a request."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from chatgate.ids import new_id
from chatgate.refusals.record import (
    MAX_REFUSAL_CHARS,
    RefusalRecord,
    body_text,
    deepseek_problem,
    kept_problems,
    rules_of,
)
from chatgate.refusals.store import RefusalStore, RefusalStoreError

log = logging.getLogger("chatgate.refusals")

FLUSH_S = 0.2
PURGE_EVERY_S = 60.0
MAX_PENDING_BYTES = 64 << 20  # bodies waiting for the writer; beyond, the oldest go


@dataclass(slots=True)
class Pending:
    """What the request path hands over: the raw body and what refused it (redacted by the writer)."""

    request_id: str
    ts: float
    key_id: str
    key_name: str
    team: str
    route: str
    model: str
    status: int
    source: str
    problems: list[dict[str, Any]] | None  # chatgate's problems, or None: DeepSeek's `answer`
    body: bytes
    answer: bytes = b""


class RefusalLog:
    def __init__(self, store: RefusalStore, keep: int, ttl_hours: float, keep_content: bool,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.keep = keep
        self.ttl_s = ttl_hours * 3600
        self.keep_content = keep_content
        self.clock = clock
        self.replica = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._pending: deque[Pending] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._purged_at = 0.0
        self.written = 0
        self.dropped = 0  # handed over but never stored (queue full, store down)
        self.last_error: str | None = None

    def start(self) -> None:
        self.store.migrate()
        self._thread = threading.Thread(target=self._run, name="chatgate-refusals", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.store.close()

    def expired_before(self) -> float:
        return self.clock() - self.ttl_s

    # --- the request path ------------------------------------------------------------

    def add(self, item: Pending) -> None:
        with self._lock:
            self._pending.append(item)
            self._bytes += len(item.body) + len(item.answer)
            pending = self._pending
            while len(pending) > self.keep or (self._bytes > MAX_PENDING_BYTES and len(pending) > 1):
                old = pending.popleft()
                self._bytes -= len(old.body) + len(old.answer)
                self.dropped += 1
        if not self._wake.is_set():
            self._wake.set()

    # --- the writer thread -----------------------------------------------------------

    def _run(self) -> None:
        """Asleep until a refusal comes (or a minute passes, to purge); then gathers for FLUSH_S and writes
        the batch. No refusals, no wake-ups: the thread costs a process serving valid requests nothing."""
        while True:
            woken = self._wake.wait(PURGE_EVERY_S)
            if woken and not self._stopping:
                self._stopped.wait(FLUSH_S)
            self._wake.clear()
            stopping = self._stopping
            self.flush()
            if stopping:
                return

    def flush(self) -> None:
        with self._lock:
            batch = list(self._pending)
            self._pending.clear()
            self._bytes = 0
        now = self.clock()
        try:
            if batch:
                rows = [self._refusal(p) for p in batch]
                self.store.insert(rows, self.replica, self.keep, now - self.ttl_s)
                self.written += len(batch)
            elif now - self._purged_at >= PURGE_EVERY_S:
                self.store.purge(now - self.ttl_s)
            self._purged_at = now
            self.last_error = None
        except (RefusalStoreError, OSError, ValueError) as exc:
            self.dropped += len(batch)
            if self.last_error is None:
                log.warning("refusals could not be stored (%s); %d dropped", exc, len(batch))
            self.last_error = str(exc)

    def _refusal(self, p: Pending) -> RefusalRecord:
        found = p.problems if p.problems is not None else deepseek_problem(p.status, p.answer)
        problems = kept_problems(found, self.keep_content)
        body, redacted = body_text(p.body, self.keep_content, MAX_REFUSAL_CHARS - len(orjson.dumps(problems)))
        return RefusalRecord(new_id(), p.request_id, p.ts, self.replica, p.key_id, p.key_name, p.team,
                             p.route, p.model, p.status, p.source, rules_of(found), problems, body, redacted)
