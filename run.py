#!/usr/bin/env python3
"""Bootstrap: `python3 run.py serve [ARGS…]` starts chatgate, `python3 run.py test [PYTEST ARGS…]` runs the
tests. The first run creates .venv and installs chatgate into it; later runs reinstall only when
pyproject.toml changed. Needs nothing but Python 3.11+."""

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


def main() -> None:
    command, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("serve", [])
    if command == "test":
        ensure_venv("[test]")
        os.chdir(ROOT)
        os.execv(BIN / "python", [str(BIN / "python"), "-m", "pytest", *args])
    ensure_venv("")
    os.execv(BIN / "chatgate", [str(BIN / "chatgate"), command, *args])


if __name__ == "__main__":
    main()
