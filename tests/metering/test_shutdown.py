"""SIGTERM: the stream in flight completes, new connections are refused, every record is flushed, exit 0."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx2
import pytest

from tests.fakes.server import run_fake_deepseek
from tests.harness import spawn_chatgate
from tests.metering.helpers import CHAT, chat_body, complete, sqlite_request_ids, wait_for

pytestmark = pytest.mark.slow  # chatgate processes stopped by signals


def test_sigterm_drains_the_stream_in_flight_and_flushes_every_record(tmp_path: Path) -> None:
    db = tmp_path / "usage.db"
    with run_fake_deepseek() as fake:
        with spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", f"sqlite:///{db}") as cg:
            earlier = [complete(cg.url, i, stream=i % 2 == 0, rid=f"earlier-{i}") for i in range(5)]
            received: list[bytes] = []
            first_bytes = threading.Event()
            errors: list[BaseException] = []
            ended: list[float] = []

            def stream_slowly() -> None:
                headers = {"authorization": "Bearer sk-team-a", "x-request-id": "in-flight",
                           "x-fake-chunk-delay": "0.2"}  # ~20 events: about 4 s
                try:
                    with httpx2.stream("POST", cg.url + CHAT, json=chat_body(1, stream=True), headers=headers,
                                       timeout=30) as resp:
                        assert resp.status_code == 200
                        for piece in resp.iter_raw():
                            received.append(piece)
                            if b"data: {" in piece:
                                first_bytes.set()
                    ended.append(time.monotonic())
                except BaseException as exc:  # surfaced in the main thread
                    errors.append(exc)
                    first_bytes.set()

            client = threading.Thread(target=stream_slowly)
            client.start()
            assert first_bytes.wait(10)
            cg.process.send_signal(signal.SIGTERM)
            # Once uvicorn has stopped listening, a new connection is refused while the stream still runs.
            wait_for(lambda: _refused(cg.url), timeout=10, what="new connections refused")
            refused_at = time.monotonic()
            client.join(30)
            assert ended and refused_at < ended[0], "the stream ran on after the listener had closed"
            assert cg.process.wait(30) == 0, cg.log()
        assert errors == []
        body = b"".join(received)
        assert body.rstrip().endswith(b"data: [DONE]"), body[-300:]
        assert b'"finish_reason":"stop"' in body
    ids = sqlite_request_ids(db)
    assert sorted(ids) == sorted([*earlier, "in-flight"]), "every record flushed before exit"
    assert list((tmp_path / "spool").glob("spool-*.jsonl")) == [], "a clean stop leaves no spool behind"


def _refused(url: str) -> bool:
    try:
        httpx2.get(url + "/healthz", timeout=2)
    except httpx2.ConnectError:
        return True
    except httpx2.TransportError:
        return False
    return False


def test_idle_server_exits_zero_on_sigint(tmp_path: Path) -> None:
    """Ctrl-C is a clean stop too (SIGTERM is covered above): exit 0, the record flushed."""
    with run_fake_deepseek() as fake, \
            spawn_chatgate(tmp_path, "--upstream", fake.url, "--store", f"sqlite:///{tmp_path}/u.db") as cg:
        complete(cg.url, 3, stream=False, rid="only")
        cg.process.send_signal(signal.SIGINT)
        assert cg.process.wait(30) == 0, cg.log()
    assert sqlite_request_ids(tmp_path / "u.db") == ["only"]
