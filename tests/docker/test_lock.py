"""docker/requirements.lock, what the image installs (`pip install --no-deps -r`): it pins every runtime
dependency in pyproject.toml, and the extras they are asked with, to a version their specifiers allow."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.harness import REPO_ROOT

LOCK = REPO_ROOT / "docker" / "requirements.lock"
# What the image leaves out on purpose (scripts/lock-image-deps.py): only huggingface_hub needs them.
LEFT_OUT = {"huggingface-hub", "filelock", "fsspec", "hf-xet", "tqdm", "packaging"}


def pins() -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)", line)
        assert m, f"not an exact pin: {line!r}"
        name = canonicalize_name(m.group(1))
        assert name not in found, f"{name} pinned twice"
        found[name] = Version(m.group(2))
    return found


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(spec) for spec in project["dependencies"]]


def test_every_runtime_dependency_is_pinned_within_its_specifier() -> None:
    locked = pins()
    for req in runtime_requirements():
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} (pyproject.toml) is not in docker/requirements.lock"
        assert locked[name] in req.specifier, f"{req.name}=={locked[name]} does not satisfy {req}"


def test_the_extras_asked_for_are_pinned_too() -> None:
    """uvicorn[standard] brings uvloop and httptools, psycopg[binary] its binary build: the lock has them
    (as the installed metadata of the dependency says; the lock's versions are checked by the image)."""
    locked = pins()
    env = {
        **default_environment(),
        "python_version": "3.12",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
    }
    checked = 0
    for req in runtime_requirements():
        if not req.extras:
            continue
        for spec in importlib.metadata.requires(req.name) or []:
            dep = Requirement(spec)
            if (
                dep.marker
                and any(dep.marker.evaluate({**env, "extra": e}) for e in req.extras)
                and not dep.marker.evaluate({**env, "extra": ""})
            ):
                assert canonicalize_name(dep.name) in locked, (
                    f"{req.name}[{','.join(req.extras)}] needs {dep.name}"
                )
                checked += 1
    assert checked >= 3


def test_nothing_left_out_is_a_runtime_dependency_of_chatgate() -> None:
    direct = {canonicalize_name(r.name) for r in runtime_requirements()}
    assert not LEFT_OUT & direct
    assert not LEFT_OUT & set(pins()), "a package the image leaves out is pinned"
    # chatgate's own code never imports them
    imports = re.compile(
        r"^\s*(?:from|import)\s+(huggingface_hub|fsspec|tqdm|filelock|hf_xet|packaging)\b", re.M
    )
    offenders = [
        str(p.relative_to(REPO_ROOT))
        for p in (REPO_ROOT / "chatgate").rglob("*.py")
        if imports.search(p.read_text())
    ]
    assert not offenders, offenders


def test_the_dockerfile_installs_from_the_lock_without_resolving() -> None:
    text = (REPO_ROOT / "docker" / "Dockerfile").read_text().replace("\\\n", " ")
    installs = [line for line in text.splitlines() if "pip install" in line]
    assert any("--no-deps" in line and "-r docker/requirements.lock" in line for line in installs), installs
    assert all("--no-deps" in line for line in installs), "every pip install in the image is --no-deps"


def test_the_build_backend_is_pinned_within_build_system_requires() -> None:
    text = (REPO_ROOT / "docker" / "Dockerfile").read_text()
    [pin] = re.findall(r"setuptools==([\d.]+)", text)
    requires = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    [backend] = [Requirement(r) for r in requires if Requirement(r).name == "setuptools"]
    assert Version(pin) in backend.specifier
    assert "--no-build-isolation" in text  # so the pinned setuptools is the one that builds chatgate
