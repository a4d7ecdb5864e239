"""LlamaIndex's own virtualenv for the zoo (it pins openai<3, chatgate's test environment has openai 3).

Built from `llamaindex-requirements.txt` on first use (about 30 s, from the package registry) into a cache
outside the checkout, keyed by the requirements and the Python version, so later runs and other checkouts
reuse it: `$CHATGATE_TEST_ENVS` or `~/.cache/chatgate-test-envs`. `python -m tests.compat.zoo.llamaindex_env`
builds it ahead of time and prints its interpreter.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

REQUIREMENTS = Path(__file__).with_name("llamaindex-requirements.txt")
CLIENT_SCRIPT = Path(__file__).with_name("llamaindex_client.py")


def env_dir() -> Path:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes() + sys.version.encode()).hexdigest()[:12]
    cache = os.environ.get("CHATGATE_TEST_ENVS") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chatgate-test-envs")
    return Path(cache) / f"llamaindex-{digest}"


def interpreter(env: Path) -> Path:
    return env / ("Scripts" if os.name == "nt" else "bin") / "python"


def ensure_env() -> Path:
    """The interpreter of LlamaIndex's virtualenv, built first if needed; RuntimeError if pip fails."""
    env = env_dir()
    done = env / ".complete"
    if done.exists():
        return interpreter(env)
    env.parent.mkdir(parents=True, exist_ok=True)
    with open(env.parent / f"{env.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run may be building it
        if not done.exists():
            shutil.rmtree(env, ignore_errors=True)
            venv.EnvBuilder(with_pip=True).create(env)
            proc = subprocess.run(
                [str(interpreter(env)), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                 "-r", str(REQUIREMENTS)], capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                shutil.rmtree(env, ignore_errors=True)
                raise RuntimeError(f"pip could not install {REQUIREMENTS.name}:\n{proc.stderr[-2000:]}")
            done.write_text("ok\n")
    return interpreter(env)


if __name__ == "__main__":
    print(ensure_env())
