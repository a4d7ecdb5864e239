#!/usr/bin/env python3
"""Bootstrap: `python3 run.py serve [ARGS…]` starts chatgate, `python3 run.py test [--quick] [PYTEST ARGS…]`
runs the tests (on every core, pytest-xdist; `--quick` leaves out the tests marked slow; docs/development.md).
The first run creates .venv and installs chatgate into it; later runs reinstall only when pyproject.toml
changed. Needs nothing but Python 3.11+."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".install-stamp"


def ensure_venv(extras: str) -> None:
    if sys.version_info < (3, 11):
        sys.exit("chatgate needs Python 3.11 or newer")
    if not (BIN / "python").exists():
        print("creating .venv …", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(VENV)
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extras.encode()).hexdigest()
    have = STAMP.read_text() if STAMP.exists() else ""
    if want not in have.split():
        print(f"installing chatgate{extras} into .venv …", file=sys.stderr)
        pip = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, "-e", f"{ROOT}{extras}"], check=True)
        STAMP.write_text(f"{have} {want}".strip())


def in_workers(args: list[str]) -> bool:
    """Whether `run.py test ARGS` should spread the tests over pytest-xdist workers: not when ARGS choose
    the workers themselves (-n, --dist, --tx), turn xdist off (-p no:xdist), or need the tests in this
    process (--pdb, --trace, -s / --capture=no: a worker's output is not the terminal)."""
    for at, arg in enumerate(args):
        if arg.startswith(("-n", "--numprocesses", "--dist", "--tx", "--pdb", "--trace", "--capture=no")):
            return False
        if arg in ("-p", "--capture") and args[at + 1:at + 2] in (["no:xdist"], ["no"]):
            return False
        short_flags = arg[1:] if arg[:1] == "-" and arg[1:].isalpha() else ""  # -s, -xs, -sv …
        if arg == "-pno:xdist" or ("s" in short_flags and args[at - 1:at] not in (["-m"], ["-k"])):
            return False
    return True


def pytest_args(args: list[str], cores: int) -> list[str]:
    """pytest's arguments for `run.py test ARGS`: `--quick` becomes `-m "not slow"` (and-ed with a `-m` of
    the caller's), and the tests are spread over `cores` pytest-xdist workers, whole modules at a time
    (module-scoped fixtures are set up once), unless ARGS say otherwise (`in_workers`)."""
    quick = "--quick" in args
    args = [a for a in args if a != "--quick"]
    if quick:
        if "-m" in args[:-1]:
            at = len(args) - 1 - args[::-1].index("-m")  # pytest uses the last -m
            args[at + 1] = f"({args[at + 1]}) and not slow"
        else:
            args = ["-m", "not slow", *args]
    if cores > 1 and in_workers(args):
        args = ["-n", str(cores), "--dist", "loadscope", *args]
    return args


def test_env(environ: dict[str, str]) -> dict[str, str]:
    """The environment of `run.py test`: the caller's, with Python's bytecode caches on. Under
    PYTHONDONTWRITEBYTECODE every run compiled the changed modules again in each worker and in each process
    a test starts, and pytest rewrote the asserts of every test module it had not cached (~10 s of CPU a
    worker); the caches go to __pycache__/ (git ignores it)."""
    return {k: v for k, v in environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def main() -> None:
    command, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("serve", [])
    if command == "test":
        ensure_venv("[test]")
        os.chdir(ROOT)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        os.execve(BIN / "python", [str(BIN / "python"), "-m", "pytest", *pytest_args(args, cores)],
                  test_env(dict(os.environ)))
    ensure_venv("")
    os.execv(BIN / "chatgate", [str(BIN / "chatgate"), command, *args])


if __name__ == "__main__":
    main()
