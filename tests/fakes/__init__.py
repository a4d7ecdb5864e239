"""Test doubles: the fake DeepSeek upstream, which lives in `app.demo` (`chatgate demo` serves it).

`app.demo.deepseek` holds the ASGI app and its state; `tests.fakes.server` runs it on a loopback port
for a test (not imported here, so that `python -m tests.fakes.server` runs cleanly).
"""

import importlib
import sys

from app.demo.app import create_fake_app
from app.demo.deepseek import FAULTS, FakeState, RecordedRequest

# The old module paths (tests.fakes.deepseek, …) still import, for tests written before the move.
for _name in ("anthropic", "anthropic_rules", "deepseek", "files", "fim", "prefix_cache", "responses",
              "rules", "server_tools", "tools"):
    sys.modules.setdefault(f"{__name__}.{_name}", importlib.import_module(f"app.demo.{_name}"))

__all__ = ["FAULTS", "FakeState", "RecordedRequest", "create_fake_app"]
