"""Suite-wide set-up: pytest-xdist workers die with the run that started them (tests/lifeline.py)."""

from __future__ import annotations

import os

import pytest

from tests import lifeline


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller is its parent
        lifeline.die_with_parent_now(os.getppid())
