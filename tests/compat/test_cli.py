"""The real Claude Code and Codex CLIs, headless, through a chatgate with its default configuration in front
of the fake DeepSeek (issue 33).

The CLIs are the npm packages pinned in tests/compat/cli/package-lock.json (installed by
scripts/install-test-tools.sh); `CHATGATE_TEST_CLI=latest` installs and runs the newest instead
(docs/claude-code.md#testing-a-new-claude-code). Each run gets a throwaway working directory and a HOME (and
XDG/config dirs) under tmp_path, so nothing of the machine's is read or touched; telemetry, update checks and
other non-essential traffic are off, and every run is bounded by a timeout. Never with a permission bypass.

For every run: exit 0; every request the CLI made was answered (chatgate's usage records for the run's key
and the fake's records agree one to one, all completed); the usage per key chatgate recorded equals what the
fake issued; the tool loop went the rounds the fake was told to make. The repairs chatgate applied are
collected into tests/artifacts/cli-results.json (and printed with -s).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from chatgate.demo.deepseek import FakeState, RecordedRequest
from chatgate.gateway.auth import fingerprint
from chatgate.runs import reading
from chatgate.settings import Settings
from chatgate.store import open_store
from tests.ci import missing
from tests.compat.zoo.recorder import Recorder
from tests.fakes.server import run_fake_deepseek
from tests.harness import REPO_ROOT, make_settings, run_chatgate
from tests.lifeline import die_with_parent

pytestmark = pytest.mark.slow  # the real CLIs, node processes

CLI_DIR = REPO_ROOT / "tests" / "compat" / "cli"
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
RUN_TIMEOUT = 120.0  # seconds per CLI run; a normal run takes one or two
QUIET = {  # Claude Code: nothing but the API (its docs: settings, "Environment variables")
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1", "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
}


def cli_bin_dir() -> Path:
    """The node_modules/.bin holding both CLIs: the pinned ones, or (CHATGATE_TEST_CLI=latest) the newest,
    installed once into tests/artifacts/cli-latest."""
    if os.environ.get("CHATGATE_TEST_CLI", "").strip().lower() != "latest":
        return CLI_DIR / "node_modules" / ".bin"
    prefix = ARTIFACTS / "cli-latest"
    bin_dir = prefix / "node_modules" / ".bin"
    if not all((bin_dir / name).exists() for name in PACKAGES):
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(prefix),
                        *(f"{pkg}@latest" for pkg in PACKAGES.values())], check=True, timeout=600)
    return bin_dir


def version_of(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ.get("PATH", ""), "HOME": "/nonexistent"}, check=False)
    return out.stdout.strip()


@dataclass
class Gate:
    url: str
    fake: FakeState
    recorder: Recorder
    db: Path
    bins: Path
    versions: dict[str, str]
    results: list[dict[str, Any]] = field(default_factory=list)

    def records(self, key: str) -> list[dict[str, Any]]:
        """chatgate's usage records of this key, once the recorder has written them all."""
        key_id = fingerprint(key)
        deadline = time.monotonic() + 10
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            rows = read_rows(self.db, key_id)
            if len(rows) >= len(self.upstream(key)):
                break
            time.sleep(0.05)
        time.sleep(0.1)  # a late or duplicate record shows up in this window
        return read_rows(self.db, key_id)

    def upstream(self, key: str) -> list[RecordedRequest]:
        self.fake.wait_idle(10)
        return [r for r in self.fake.requests if r.auth_key == key]


def read_rows(db: Path, key_id: str) -> list[dict[str, Any]]:
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM usage WHERE key_id = ? ORDER BY ts", (key_id,))]
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


@pytest.fixture(scope="module")
def cli_gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    if shutil.which("node") is None:
        missing("Node.js is not installed (scripts/install-test-tools.sh)")
    bins = cli_bin_dir()
    absent = [name for name in PACKAGES if not (bins / name).exists()]
    if absent:
        missing(f"{', '.join(PACKAGES[n] for n in absent)} not installed in {bins.parent.parent} "
                "(scripts/install-test-tools.sh)")
    versions = {name: version_of(bins / name) for name in PACKAGES}
    tmp = tmp_path_factory.mktemp("cli-gate")
    recorder = Recorder()
    with run_fake_deepseek() as fake:
        # chatgate's defaults (make_settings turns retries and the access log off for other tests: back on
        # here); only the store and spool are in tmp, flushed every 5 ms
        defaults = Settings()
        settings = make_settings(tmp, fake.url, upstream={"retries": defaults.upstream.retries},
                                 server={"access_log": defaults.server.access_log})
        with run_chatgate(settings, wrap=recorder.wrap) as running:
            g = Gate(running.url, fake.state, recorder, tmp / "usage.db", bins, versions)
            yield g
    ARTIFACTS.mkdir(exist_ok=True)
    results = {"versions": versions, "runs": g.results}
    (ARTIFACTS / "cli-results.json").write_text(json.dumps(results, indent=1))
    for result in g.results:
        print(f"\n{result['client']} {result['version']} {result['scenario']}: exit {result['exit']}, "
              f"{result['requests']} request(s), models {result['models']}, "
              f"repairs {result['repairs'] or '-'}, "
              f"warnings {result['warnings'] or '-'}, other requests {result['unserved'] or '-'}")


@pytest.fixture
def fresh(cli_gate: Gate) -> Gate:
    cli_gate.fake.wait_idle(10)
    cli_gate.fake.reset()
    return cli_gate


@dataclass
class Run:
    key: str
    exit: int
    stdout: str
    stderr: str


def sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A working directory with a README, and an environment with nothing of the machine's in it but PATH."""
    tmp_path.mkdir(exist_ok=True)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    (work / "README.md").write_text("# demo\nThe answer is 42.\n")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "USER": "tester",
        "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"), "XDG_STATE_HOME": str(home / ".local" / "state"),
        "TMPDIR": str(tmp_path), "LANG": "C.UTF-8", "NO_COLOR": "1", "TERM": "dumb",
    }
    return work, env


def run(args: list[str], cwd: Path, env: dict[str, str], key: str) -> Run:
    try:
        done = subprocess.run(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=RUN_TIMEOUT, check=False, preexec_fn=die_with_parent())
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{args[0]} did not finish in {RUN_TIMEOUT:g} s: {exc.stdout!r} {exc.stderr!r}")
    return Run(key, done.returncode, done.stdout, done.stderr)


def claude(gate: Gate, tmp_path: Path, key: str, prompt: str, *flags: str, **extra_env: str) -> Run:
    work, env = sandbox(tmp_path)
    env.update(QUIET)
    env.update({"ANTHROPIC_BASE_URL": gate.url + "/anthropic", "ANTHROPIC_AUTH_TOKEN": key,
                "CLAUDE_CONFIG_DIR": env["HOME"] + "/.claude", **extra_env})
    return run([str(gate.bins / "claude"), "-p", prompt, *flags], work, env, key)


CODEX_CONFIG = """\
model = "deepseek-flash"
model_provider = "chatgate"
model_reasoning_effort = "high"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.chatgate]
name = "chatgate"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "CHATGATE_API_KEY"
"""


def codex(gate: Gate, tmp_path: Path, key: str, prompt: str, *flags: str, extra_config: str = "") -> Run:
    work, env = sandbox(tmp_path)
    codex_home = Path(env["HOME"]) / ".codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(extra_config + CODEX_CONFIG.format(url=gate.url))
    env.update({"CODEX_HOME": str(codex_home), "CHATGATE_API_KEY": key})
    return run([str(gate.bins / "codex"), "exec", "--sandbox", "read-only", "--skip-git-repo-check", *flags,
                prompt], work, env, key)


def check_run(gate: Gate, done: Run, client: str, scenario: str, route: str) -> list[RecordedRequest]:
    """The assertions every run shares; returns what reached the fake. Records the run's repairs."""
    assert done.exit == 0, f"{client} exited {done.exit}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    assert "Answer" in done.stdout, f"the fake's answer is not in the output: {done.stdout!r} {done.stderr!r}"
    upstream = gate.upstream(done.key)
    rows = gate.records(done.key)
    sent = [x for x in gate.recorder.exchanges if x.method == "POST" and x.path.startswith(route)
            and done.key in (x.headers.get("authorization", "") + x.headers.get("x-api-key", ""))]
    assert upstream, "no request reached the fake"
    assert [x.status for x in sent] == [200] * len(sent), [(x.status, bytes(x.response[:300])) for x in sent]
    assert [r["outcome"] for r in rows] == ["ok"] * len(upstream), rows
    assert all(r.completed and r.status == 200 for r in upstream), [(r.status, r.outcome) for r in upstream]
    assert len(sent) == len(upstream) == len(rows)
    issued = gate.fake.issued_usage[done.key]
    recorded = {k: sum(r[k] for r in rows) for k in ("prompt_tokens", "completion_tokens",
                                                     "prompt_cache_hit_tokens", "prompt_cache_miss_tokens")}
    assert recorded == {k: issued[k] for k in recorded}, (recorded, issued)
    assert all(r["tokens_exact"] for r in rows)
    repairs = sorted({code for r in rows if r["repairs"] for code in r["repairs"].split(",")})
    # the one notice a client is told (once per key and hour): Claude Code's default model is priced as pro
    warnings = sorted({w for x in sent for w in x.response_headers.get("x-chatgate-warning", "").split(" | ")
                       if w and "served by DeepSeek as deepseek-v4-pro" not in w})
    unserved = sorted({f"{x.method} {x.path} -> {x.status}" for x in gate.recorder.exchanges
                       if x.method != "POST" and x.path != "/metrics"})
    gate.results.append({"client": client, "version": gate.versions[client], "scenario": scenario,
                         "exit": done.exit, "requests": len(upstream), "repairs": repairs,
                         "warnings": warnings, "unserved": unserved,
                         "models": sorted({r["model"] for r in rows}),
                         "queries": sorted({x.query for x in sent})})
    # quiet where nothing is wrong: what the client cannot change is a notice, never a warning per request
    assert not warnings, f"x-chatgate-warning on {client}'s requests: {warnings}"
    assert sorted(x.query for x in sent) == sorted(r.query for r in upstream), "the query string goes on"
    return upstream


def runs_of(gate: Gate, key: str, requests: int) -> list[tuple[str, int]]:
    """The agent runs chatgate made of a key's requests (docs/runs.md), read as `chatgate runs` reads them,
    once it has written them all: (how the run was told apart, its requests) per run."""
    deadline = time.monotonic() + 10
    found: list[tuple[str, int]] = []
    while time.monotonic() < deadline:
        store = open_store(f"sqlite:///{gate.db}")
        try:
            heads = reading.find(store, None, fingerprint(key), 0.0, 100)
            found = sorted((h.source, h.requests) for h in heads)
        finally:
            store.close()
        if sum(n for _, n in found) >= requests:
            break
        time.sleep(0.05)
    return found


def bodies(upstream: list[RecordedRequest]) -> list[dict[str, Any]]:
    return [json.loads(r.body) for r in upstream]


def tool_results_sent(upstream: list[RecordedRequest]) -> int:
    """Requests that carried the result of a tool the fake had called (the loop's later rounds)."""
    count = 0
    for body in bodies(upstream):
        last = (body.get("messages") or body.get("input") or [{}])[-1]
        content = last.get("content") if isinstance(last.get("content"), list) else []
        if last.get("type") in ("function_call_output", "custom_tool_call_output") or any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            count += 1
    return count


# ----------------------------------------------------------------------------------------------- Claude Code


@pytest.mark.parametrize(("scenario", "flags", "served"), [
    ("default model", [], "deepseek-v4-pro"),
    ("--model opus", ["--model", "opus"], "deepseek-v4-pro"),
    ("--model sonnet", ["--model", "sonnet"], "deepseek-flash"),
    ("--model haiku", ["--model", "haiku"], "deepseek-flash"),
    ("--model fable", ["--model", "fable"], "deepseek-flash"),
    ("--model opusplan", ["--model", "opusplan"], "deepseek-flash"),  # sonnet outside plan mode
])
def test_claude_code_on_each_model(fresh: Gate, tmp_path: Path, scenario: str, flags: list[str],
                                   served: str) -> None:
    key = f"sk-cli-claude-{scenario.replace(' ', '-').replace('--', '')}"
    done = claude(fresh, tmp_path, key, "list the files here and read README", *flags)
    upstream = check_run(fresh, done, "claude", scenario, "/anthropic/")
    assert served in {r["model"] for r in fresh.records(key)}
    for body in bodies(upstream):
        assert all(m["role"] in ("user", "assistant") for m in body["messages"])
    assert {r.query for r in upstream} == {"beta=true"}, "Claude Code's ?beta=true reached DeepSeek"


def test_claude_code_thinking_tool_loop(fresh: Gate, tmp_path: Path) -> None:
    fresh.fake.configure(tool_rounds=3, tool_name="Read",
                         tool_arguments=json.dumps({"file_path": str(tmp_path / "work" / "README.md")}))
    key = "sk-cli-claude-thinking-loop"
    done = claude(fresh, tmp_path, key, "read README and tell me the answer")
    upstream = check_run(fresh, done, "claude", "thinking tool loop (3 rounds)", "/anthropic/")
    assert tool_results_sent(upstream) >= 3
    assert runs_of(fresh, key, len(upstream)) == [("session", len(upstream))], "one run: the session"
    main = [b for b in bodies(upstream) if any(m["role"] == "assistant" for m in b["messages"])]
    last = main[-1]
    assert "The answer is 42." in json.dumps(last["messages"]), "Read ran and its result went back"
    for message in last["messages"]:
        kinds = [b.get("type") for b in message["content"]] if isinstance(message["content"], list) else []
        if message["role"] == "assistant" and "tool_use" in kinds:
            assert kinds[0] == "thinking", kinds  # thinking on: each tool-use turn keeps its block (A10)


@pytest.mark.parametrize(("scenario", "flags"), [
    ("MAX_THINKING_TOKENS=0, default model", []),
    ("MAX_THINKING_TOKENS=0, --model claude-sonnet-4-6", ["--model", "claude-sonnet-4-6"]),
])
def test_claude_code_with_thinking_off(fresh: Gate, tmp_path: Path, scenario: str, flags: list[str]) -> None:
    """Claude Code 2.1.332 keeps adaptive thinking on its 5.5 models whatever MAX_THINKING_TOKENS says; on
    the 4.6 models it turns thinking off for, it sends `thinking: disabled` with `output_config.effort`
    "high", which DeepSeek refuses: thinking_conflict drops the effort, so DeepSeek never gets both."""
    fresh.fake.configure(tool_rounds=2)
    key = "sk-cli-claude-thinking-off-" + str(len(flags))
    done = claude(fresh, tmp_path, key, "list the files here", *flags, MAX_THINKING_TOKENS="0")
    upstream = check_run(fresh, done, "claude", scenario, "/anthropic/")
    sent = bodies(upstream)
    asked = [json.loads(bytes(x.body)) for x in fresh.recorder.exchanges  # what Claude Code sent chatgate
             if x.method == "POST" and x.path.startswith("/anthropic/") and x.auth_key == key]
    fresh.results[-1]["thinking"] = sorted({str((b.get("thinking") or {}).get("type")) for b in asked})
    fresh.results[-1]["client effort"] = sorted({str((b.get("output_config") or {}).get("effort"))
                                                 for b in asked})
    for body in sent:
        if (body.get("thinking") or {}).get("type") == "disabled":
            assert "effort" not in (body.get("output_config") or {}), body.get("output_config")
    if flags:
        shapes = [(b.get("model"), b.get("thinking"), b.get("output_config")) for b in asked]
        assert all(thinking == {"type": "disabled"} and "effort" in (config or {})
                   for _, thinking, config in shapes), shapes
        assert "thinking_conflict" in fresh.results[-1]["repairs"]
    assert tool_results_sent(upstream) >= 2


def test_claude_code_continue(fresh: Gate, tmp_path: Path) -> None:
    key = "sk-cli-claude-continue"
    first = claude(fresh, tmp_path, key, "remember the word pelican")
    assert first.exit == 0, first.stderr
    before = len(fresh.upstream(key))
    done = claude(fresh, tmp_path, key, "which word did I ask you to remember?", "--continue")
    upstream = check_run(fresh, done, "claude", "--continue", "/anthropic/")
    resumed = bodies(upstream[before:])
    assert resumed and any("pelican" in json.dumps(b["messages"]) for b in resumed), "the session came back"


def test_claude_code_three_sessions_at_once(fresh: Gate, tmp_path: Path) -> None:
    fresh.fake.configure(tool_rounds=2)
    keys = [f"sk-cli-claude-concurrent-{i}" for i in range(3)]
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda i: claude(fresh, tmp_path / f"s{i}", keys[i], f"session {i}: list files"),
                             range(3)))
    for done in runs:
        upstream = check_run(fresh, done, "claude", f"3 sessions at once ({done.key[-1]})", "/anthropic/")
        assert runs_of(fresh, done.key, len(upstream)) == [("session", len(upstream))]


def test_claude_code_subagent(fresh: Gate, tmp_path: Path) -> None:
    """The main agent calls the Agent tool (an Explore subagent in the foreground: it has no Agent tool
    itself, so the fake's loop ends); the subagent's requests go through chatgate like the main agent's."""
    prompt = "list the files of this directory"
    fresh.fake.configure(tool_rounds=1, tool_name="Agent", tool_arguments=json.dumps({
        "description": "look around", "prompt": prompt, "subagent_type": "Explore",
        "run_in_background": False}))
    key = "sk-cli-claude-subagent"
    done = claude(fresh, tmp_path, key, "use a subagent to list the files")
    upstream = check_run(fresh, done, "claude", "subagent (Agent tool, Explore)", "/anthropic/")
    sub = [b for b in bodies(upstream) if prompt in json.dumps(b["messages"][0])]
    assert sub, "the subagent's requests reached DeepSeek"
    main = [b for b in bodies(upstream) if "use a subagent" in json.dumps(b["messages"][0])]
    assert tool_results_sent(upstream) >= 2, "the subagent's tool round and the Agent call's result"
    calls = [block for m in main[-1]["messages"] if isinstance(m["content"], list) for block in m["content"]
             if block.get("type") == "tool_use" and block.get("name") == "Agent"]
    assert calls, "the main agent's last request carries its Agent call (and its result after it)"
    assert runs_of(fresh, key, len(upstream)) == [("session", len(upstream))], "the subagent is in its run"


# ----------------------------------------------------------------------------------------------- Codex


def test_codex_exec_multi_round_tool_loop(fresh: Gate, tmp_path: Path) -> None:
    fresh.fake.configure(tool_rounds=3, tool_name="exec_command",
                         tool_arguments=json.dumps({"cmd": "cat README.md"}))
    key = "sk-cli-codex-loop"
    done = codex(fresh, tmp_path, key, "read README and tell me the answer")
    upstream = check_run(fresh, done, "codex", "exec --sandbox read-only, tool loop (3 rounds)",
                         "/v1/responses")
    assert tool_results_sent(upstream) >= 3
    assert runs_of(fresh, key, len(upstream)) == [("session", len(upstream))], "one run: the conversation"
    last = bodies(upstream)[-1]
    outputs = [i for i in last["input"] if i.get("type") == "function_call_output"]
    assert len(outputs) >= 3
    assert "The answer is 42." in json.dumps(outputs), outputs
    assert {r["model"] for r in fresh.records(key)} == {"deepseek-flash"}
    assert "Model metadata for `deepseek-flash` not found" in done.stderr, "the default config: Codex warns"


@pytest.mark.parametrize(("scenario", "extra", "warned"), [
    ("model_context_window", "model_context_window = 1048576\nmodel_auto_compact_token_limit = 943718\n",
     True),
    ("model_catalog_json (config/codex-models.json)",
     f'model_catalog_json = "{REPO_ROOT / "config" / "codex-models.json"}"\n', False),
])
def test_codex_model_metadata_warning(fresh: Gate, tmp_path: Path, scenario: str, extra: str,
                                      warned: bool) -> None:
    """docs/codex.md: only a model catalog entry stops Codex's "Model metadata … not found" warning; the
    window keys alone set the window and leave it."""
    key = "sk-cli-codex-meta-" + str(warned)
    done = codex(fresh, tmp_path, key, "say hello", extra_config=extra)
    check_run(fresh, done, "codex", f"exec with {scenario}", "/v1/responses")
    assert ("Model metadata for `deepseek-flash` not found" in done.stderr) is warned, done.stderr
