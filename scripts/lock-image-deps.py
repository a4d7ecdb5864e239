#!/usr/bin/env python3
"""Write docker/requirements.lock: the exact versions the image installs (`pip install --no-deps -r`).

    .venv/bin/python scripts/lock-image-deps.py [--python /path/to/python3.12]

pip resolves pyproject.toml's runtime dependencies for the image's Python (3.12, Linux) against PyPI only
(`pip install --dry-run --report`, this machine's local wheel folders and extra indexes ignored); this
script walks the resolved metadata from chatgate, leaves out what only the Hugging Face hub client needs
(the `tokenizers` package depends on huggingface_hub for `Tokenizer.from_pretrained`; chatgate loads its
tokenizer from a file: chatgate/metering/tokens.py) and writes one `name==version` per line.
tests/docker/test_lock.py checks the result against pyproject.toml.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "docker" / "requirements.lock"
# Installed by pip for huggingface_hub only; chatgate never imports it (Tokenizer.from_file).
LEFT_OUT = {"huggingface-hub"}


def resolve(python: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, src / name)
        shutil.copytree(ROOT / "chatgate", src / "chatgate", ignore=shutil.ignore_patterns("__pycache__"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env.update(
            PIP_CONFIG_FILE=os.devnull,
            PIP_INDEX_URL="https://pypi.org/simple",
            PIP_CERT=os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"),
        )
        report = Path(tmp) / "report.json"
        subprocess.run(
            [
                python,
                "-m",
                "pip",
                "install",
                "-q",
                "--dry-run",
                "--ignore-installed",
                "--report",
                str(report),
                str(src),
            ],
            check=True,
            env=env,
        )
        data: dict[str, object] = json.loads(report.read_text())
        return data


def marker_env(python: str) -> dict[str, str]:
    out = subprocess.run(
        [
            python,
            "-c",
            "import json; from packaging.markers import default_environment as d;print(json.dumps(d()))",
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode == 0:
        env: dict[str, str] = json.loads(out.stdout)
        return env
    code = (
        "import json, platform, sys, os; print(json.dumps({'python_version': '%d.%d' % sys.version_info[:2],"
        "'python_full_version': platform.python_version(), 'sys_platform': sys.platform,"
        "'platform_system': platform.system(), 'platform_machine': platform.machine(),"
        "'implementation_name': sys.implementation.name, 'os_name': os.name,"
        "'platform_python_implementation': platform.python_implementation()}))"
    )
    env = {**default_environment(), **json.loads(subprocess.check_output([python, "-c", code], text=True))}
    return env


def main() -> None:
    parser = argparse.ArgumentParser()
    found = sorted(Path("/root/.pyenv/versions").glob("3.12.*/bin/python3.12"))
    parser.add_argument(
        "--python",
        default=str(found[-1]) if found else "python3.12",
        help="a CPython 3.12, as in the image (default: pyenv's)",
    )
    args = parser.parse_args()
    report = resolve(args.python)
    env = marker_env(args.python)
    installs = {
        canonicalize_name(i["metadata"]["name"]): i["metadata"]  # type: ignore[index]
        for i in report["install"]
    }  # type: ignore[attr-defined]
    keep: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [("chatgate", frozenset())]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen or name in LEFT_OUT:
            continue
        seen.add((name, extras))
        keep.add(name)
        for spec in installs[name].get("requires_dist") or []:
            req = Requirement(spec)
            if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""})):
                continue
            todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    keep.discard("chatgate")
    lines = [f"{installs[n]['name']}=={installs[n]['version']}" for n in sorted(keep)]
    dropped = sorted(set(installs) - keep - {"chatgate"})
    header = [
        "# The image's runtime packages, exact (docker/Dockerfile installs them with --no-deps, then "
        "chatgate).",
        f"# Resolved for Python {env['python_full_version']} on "
        f"{env['sys_platform']}/{env['platform_machine']} "
        "from PyPI by scripts/lock-image-deps.py; regenerate after changing pyproject.toml's dependencies.",
        f"# Left out (only huggingface_hub needs them; chatgate never imports it): {', '.join(dropped)}",
    ]
    LOCK.write_text("\n".join(header + lines) + "\n")
    print(f"{LOCK.relative_to(ROOT)}: {len(lines)} packages; left out {', '.join(dropped)}", file=sys.stderr)


if __name__ == "__main__":
    main()
