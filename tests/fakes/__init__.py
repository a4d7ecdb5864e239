"""Test doubles: a fake DeepSeek upstream.

`tests.fakes.deepseek` holds the ASGI app and its state; `tests.fakes.server` runs it on a loopback port
(not imported here, so that `python -m tests.fakes.server` runs cleanly).
"""

from tests.fakes.deepseek import FAULTS, FakeState, RecordedRequest, create_fake_app

__all__ = ["FAULTS", "FakeState", "RecordedRequest", "create_fake_app"]
