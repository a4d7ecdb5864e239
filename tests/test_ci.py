"""`CI` decides whether a missing tool skips or fails a test: only a true value counts."""

from __future__ import annotations

import pytest

from tests.ci import in_ci


@pytest.mark.parametrize(("value", "expected"), [
    ("true", True), ("1", True), ("yes", True), ("True", True), ("github-actions", True),
    ("", False), ("false", False), ("FALSE", False), ("0", False), ("no", False), ("off", False),
])
def test_ci_flag(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci() is expected


def test_ci_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    assert in_ci() is False
