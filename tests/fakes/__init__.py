"""Test doubles: the fake DeepSeek upstream, which lives in `app.demo` (`chatgate demo` serves it).

`app.demo.deepseek` holds the ASGI app's state and `app.demo.app` composes its routes; `tests.fakes.server`
runs it on a loopback port for a test (not imported here, so that `python -m tests.fakes.server` runs
cleanly).
"""

from app.demo.app import create_fake_app
from app.demo.deepseek import FAULTS, FakeState, RecordedRequest

__all__ = ["FAULTS", "FakeState", "RecordedRequest", "create_fake_app"]
