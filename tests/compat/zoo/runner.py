"""Runs the zoo's scenarios with each client (in process, under Node, or in LlamaIndex's virtualenv) and
collects, per scenario, what the client got, what it sent to chatgate and what reached the fake DeepSeek."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatgate.demo.deepseek import FakeState, RecordedRequest
from tests.compat.zoo.model import (
    CLIENT_KEY,
    CLIENTS,
    COMPLETES,
    CONTROL_KEY,
    Outcome,
    Scenario,
    scenarios,
    tag_of,
)
from tests.compat.zoo.recorder import Exchange, Recorder, loopback_only
from tests.lifeline import die_with_parent

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
NODE_PACKAGES = ("openai", "ai", "@ai-sdk/deepseek", "@ai-sdk/openai-compatible", "zod")


class Unavailable(Exception):
    """A runtime a client needs is missing (node, its packages, LlamaIndex's virtualenv)."""


@dataclass(frozen=True)
class Job:
    scenario: Scenario
    target: str  # "gate" (through chatgate), "control" (straight to the fake), or a capture's own name
    base_url: str
    api_key: str

    def as_json(self) -> dict[str, Any]:
        return self.scenario.job(self.base_url, self.api_key, self.target)


@dataclass
class Batch:
    """Outcomes of one client's jobs, by (scenario id, target), and the outside hosts it tried to reach."""

    outcomes: dict[tuple[str, str], Outcome] = field(default_factory=dict)
    network: list[str] = field(default_factory=list)


def run_jobs(client: str, jobs: list[Job]) -> Batch:
    runtime = CLIENTS[client].runtime
    if runtime == "python":
        return run_python(client, jobs)
    return run_subprocess(client, jobs, runtime)


def run_python(client: str, jobs: list[Job]) -> Batch:
    from tests.compat.zoo.python_clients import DRIVERS, run  # the client libraries: imported when needed

    batch = Batch()
    for job in jobs:
        with loopback_only() as tried:
            batch.outcomes[(job.scenario.id, job.target)] = run(DRIVERS[client], job.scenario, job.base_url,
                                                                 job.api_key)
        batch.network += tried
    return batch


def node_command() -> list[str]:
    node = shutil.which("node")
    if node is None:
        raise Unavailable("node is not installed (scripts/install-test-tools.sh)")
    missing = [p for p in NODE_PACKAGES if not (NODE_DIR / "node_modules" / p / "package.json").exists()]
    if missing:
        raise Unavailable(f"tests/compat/node/node_modules lacks {', '.join(missing)} (npm install there)")
    return [node, "zoo.mjs"]


def llamaindex_command() -> list[str]:
    from tests.compat.zoo.llamaindex_env import CLIENT_SCRIPT, ensure_env

    try:
        python = ensure_env()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"LlamaIndex's virtualenv could not be built: {exc}") from exc
    return [str(python), str(CLIENT_SCRIPT)]


def run_subprocess(client: str, jobs: list[Job], runtime: str) -> Batch:
    command = node_command() if runtime == "node" else llamaindex_command()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([job.as_json() for job in jobs], f)
    try:
        proc = subprocess.run([*command, f.name], cwd=NODE_DIR if runtime == "node" else None,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "NO_COLOR": "1"}, preexec_fn=die_with_parent())
    finally:
        os.unlink(f.name)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise AssertionError(f"{client} driver failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    batch = Batch(network=list(data["network"]))
    for result in data["results"]:
        batch.outcomes[(result["id"], result["target"])] = Outcome.from_json(result)
    return batch


# ----------------------------------------------------------------------------------------------- the zoo


@dataclass
class ScenarioRun:
    """One scenario through chatgate, and (for an expected refusal) the same client straight to the fake."""

    scenario: Scenario
    outcome: Outcome
    sent: list[Exchange]  # chat requests the client sent to chatgate, in order, with chatgate's answers
    upstream: list[RecordedRequest]  # what reached the fake DeepSeek through chatgate
    control: Outcome | None
    control_upstream: list[RecordedRequest]
    network: list[str]  # outside hosts the client library tried during its whole batch


def chat_requests(records: list[RecordedRequest], tag: str, key: str) -> list[RecordedRequest]:
    return [r for r in records
            if r.path.endswith("/chat/completions") and r.auth_key == key and tag_of(r.body) == tag]


def chat_exchanges(exchanges: list[Exchange], tag: str, key: str) -> list[Exchange]:
    return [e for e in exchanges if e.method == "POST" and e.path.endswith("/chat/completions")
            and e.auth_key == key and tag_of(bytes(e.body)) == tag]


class Zoo:
    """Runs each client's scenarios once, on first use, against one chatgate and its fake DeepSeek."""

    def __init__(self, gate_url: str, fake_url: str, fake: FakeState, recorder: Recorder) -> None:
        self.gate_url, self.fake_url, self.fake, self.recorder = gate_url, fake_url, fake, recorder
        self._runs: dict[str, dict[str, ScenarioRun]] = {}
        self._unavailable: dict[str, Unavailable] = {}

    def run(self, scenario: Scenario) -> ScenarioRun:
        client = scenario.client
        if client in self._unavailable:
            raise self._unavailable[client]
        if client not in self._runs:
            try:
                self._runs[client] = self._run_client(client)
            except Unavailable as missing:
                self._unavailable[client] = missing
                raise
        return self._runs[client][scenario.id]

    def _run_client(self, client: str) -> dict[str, ScenarioRun]:
        route = CLIENTS[client].route
        mine = list(scenarios(client))
        jobs = [Job(s, "gate", self.gate_url + route, CLIENT_KEY) for s in mine]
        jobs += [Job(s, "control", self.fake_url + route, CONTROL_KEY)
                 for s in mine if s.expected != COMPLETES]
        self.fake.wait_idle(5)
        batch = run_jobs(client, jobs)
        self.fake.wait_idle(5)
        records, exchanges = list(self.fake.requests), list(self.recorder.exchanges)
        return {s.id: ScenarioRun(
            s, batch.outcomes[(s.id, "gate")], chat_exchanges(exchanges, s.id, CLIENT_KEY),
            chat_requests(records, s.id, CLIENT_KEY), batch.outcomes.get((s.id, "control")),
            chat_requests(records, s.id, CONTROL_KEY), batch.network) for s in mine}
