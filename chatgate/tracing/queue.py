"""The traces waiting to be exported, and the thread that exports them.

A request's trace is queued as one item when the request ends (`put`, on the event loop: a deque append)
and exported with others in batches by a daemon thread: every `delay` seconds, or as soon as a batch is
waiting. The queue is bounded: when it is full the oldest trace is dropped and its spans counted
(`queue_full`), so an exporter that is down or slow costs a request nothing. This is what the SDK's
BatchSpanProcessor does; chatgate's items are its own traces (chatgate.tracing.spans.ExchangeTrace), not the
SDK's spans, and their drops are counted in spans, which the SDK's processor says nothing about.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

log = logging.getLogger("chatgate.tracing")

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


class BatchExporter(Protocol[T_contra]):
    def export(self, items: Sequence[T_contra]) -> object: ...

    def shutdown(self) -> None: ...


class ExportQueue(Generic[T]):
    def __init__(self, exporter: BatchExporter[T], count: Callable[[T], int], max_items: int,
                 batch: int, delay: float) -> None:
        self.exporter = exporter
        self.count = count  # the spans of an item
        self.max_items = max(1, max_items)
        self.batch = max(1, min(batch, self.max_items))
        self.delay = delay
        self.queue_full = 0  # spans dropped: the queue was full
        self._items: deque[T] = deque()
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._stopped = False
        self._thread = self._start()
        reset = weakref.WeakMethod(self._after_fork)
        os.register_at_fork(after_in_child=lambda: (method := reset()) is not None and method())

    def _start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="chatgate-trace-export", daemon=True)
        thread.start()
        return thread

    def _after_fork(self) -> None:
        """A forked worker: the parent's thread is not in it, and its lock may have been held."""
        self._items.clear()
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._thread = self._start()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        items = self._items
        if len(items) >= self.max_items:
            with contextlib.suppress(IndexError):  # the export thread took them all meanwhile: no drop
                self.queue_full += self.count(items.popleft())
        items.append(item)
        if len(items) >= self.batch:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self.delay)
            self._wake.clear()
            self._export_waiting()

    def _export_waiting(self, deadline: float | None = None) -> bool:
        """Export what is queued, a batch at a time; False when `deadline` (a monotonic time) came first."""
        timeout = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._export_lock.acquire(timeout=timeout):
            return False
        try:
            items = self._items
            while items:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                batch = [items.popleft() for _ in range(min(self.batch, len(items)))]
                try:
                    self.exporter.export(batch)
                except Exception:  # an exporter's bug must not end the thread
                    log.exception("exporting %d trace(s) failed", len(batch))
            return True
        finally:
            self._export_lock.release()

    def force_flush(self, timeout_ms: int = 30000) -> bool:
        """Export everything queued now, in the caller's thread, for at most `timeout_ms`."""
        return self._export_waiting(time.monotonic() + timeout_ms / 1000)

    def shutdown(self, timeout_ms: int = 30000) -> None:
        """Export what is queued (for at most `timeout_ms`), stop the thread and the exporter (once)."""
        if self._stopped:
            return
        self.force_flush(timeout_ms)
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=1.0)
        self.exporter.shutdown()
