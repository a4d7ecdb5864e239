"""Missing tools or services: a skip on a developer's machine, a failure in CI (`CI` set to a true value)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

FALSE = ("", "0", "false", "no", "off")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in FALSE


def missing(reason: str) -> NoReturn:
    """Skip the test, or fail it in CI, where every test must run."""
    if in_ci():
        pytest.fail(f"{reason} (CI must run this test)")
    pytest.skip(f"{reason} (CI is unset)")
