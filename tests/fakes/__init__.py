"""Test doubles: the fake DeepSeek upstream, which lives in `chatgate.demo` (`chatgate demo` serves it).

`chatgate.demo.deepseek` holds the ASGI app's state and `chatgate.demo.app` composes its routes;
`tests.fakes.server` runs it on a loopback port for a test (not imported here, so that
`python -m tests.fakes.server` runs cleanly).
"""

from chatgate.demo.app import create_fake_app
from chatgate.demo.deepseek import FAULTS, FakeState, RecordedRequest

__all__ = ["FAULTS", "FakeState", "RecordedRequest", "create_fake_app"]
