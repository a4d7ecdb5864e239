"""`python3 run.py test` turns its arguments into pytest's: the workers, `--quick`, and what opts out."""

from __future__ import annotations

import pytest

import run

WORKERS = ["-n", "2", "--dist", "loadscope"]


@pytest.mark.parametrize(("given", "expected"), [
    ([], WORKERS),
    (["-q", "tests/test_ci.py"], [*WORKERS, "-q", "tests/test_ci.py"]),
    (["--quick"], [*WORKERS, "-m", "not slow"]),
    (["--quick", "-m", "postgres", "-x"], [*WORKERS, "-m", "(postgres) and not slow", "-x"]),
    (["-k", "s"], [*WORKERS, "-k", "s"]),
])
def test_spread_over_the_cores(given: list[str], expected: list[str]) -> None:
    assert run.pytest_args(given, cores=2) == expected


@pytest.mark.parametrize("given", [
    ["-n", "4"], ["-n4"], ["--numprocesses=auto"], ["--dist", "load"], ["-p", "no:xdist"], ["-pno:xdist"],
    ["-s"], ["-xs"], ["--capture=no"], ["--capture", "no"], ["--pdb"], ["--trace"],
])
def test_arguments_that_choose_otherwise_are_left_alone(given: list[str]) -> None:
    assert run.pytest_args(given, cores=2) == given


def test_one_core_runs_in_one_process() -> None:
    assert run.pytest_args(["--quick"], cores=1) == ["-m", "not slow"]


def test_the_tests_write_bytecode_caches() -> None:
    env = {"PATH": "/usr/bin", "PYTHONDONTWRITEBYTECODE": "1", "CI": "true"}
    assert run.test_env(env) == {"PATH": "/usr/bin", "CI": "true"}
