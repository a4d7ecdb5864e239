"""`chatgate config check`, bad configs on `serve` and `config check` (one line naming the setting, exit 2),
the example config file, and `--help` on every command; real processes (`python -m chatgate ...`)
where it matters."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

from chatgate.cli import build_parser, main
from chatgate.settings import SECRETS, ModelSettings, Settings, load_settings
from tests.harness import REPO_ROOT, free_port

EXAMPLE = REPO_ROOT / "config" / "chatgate.toml"


def chatgate(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None
             ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("CHATGATE_") and k not in ("DEEPSEEK_API_KEY",)}
    data = {"XDG_DATA_HOME": tempfile.mkdtemp(prefix="chatgate-cli-data-")}  # never the user's default store
    return subprocess.run([sys.executable, "-m", "chatgate", *args], capture_output=True, text=True,
                          timeout=30, env={**clean, "PYTHONPATH": str(REPO_ROOT), **data, **(env or {})},
                          cwd=cwd or REPO_ROOT)


def all_settings() -> list[str]:
    names = []
    for section, field in Settings.model_fields.items():
        if section == "models":
            continue
        names += [f"{section}.{key}" for key in field.annotation.model_fields]  # type: ignore[union-attr]
    return names


# --- config check ------------------------------------------------------------------------------------


ADMIN_LIVE = "admin-live-42-0123456789abcdef0123456789"


def test_config_check_prints_every_setting_with_its_source(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[server]\nport = 9001\n[store]\nurl = "postgresql://chatgate:pg-pass-77@db:5432/cg"\n')
    env = {"CHATGATE_SERVER_WORKERS": "4", "DEEPSEEK_API_KEY": "sk-live-upstream-31337",
           "CHATGATE_ADMIN_KEY": ADMIN_LIVE,
           "CHATGATE_ALERTS_WEBHOOK_URL": "https://hooks.example.com/services/hook-secret-99"}
    out = chatgate("config", "check", "--config", str(config), env=env)
    assert out.returncode == 0, out.stderr
    lines = {m.group(1): (m.group(2), m.group(3))
             for m in re.finditer(r"^(\S+)\s+= (.*)  \[(default|file|env|flag)\]$", out.stdout, re.M)}
    assert set(all_settings()) <= set(lines), set(all_settings()) - set(lines)
    assert lines["server.port"] == ("9001", "file")
    assert lines["server.workers"] == ("4", "env")
    assert lines["server.host"] == ("'127.0.0.1'", "default")
    for secret in SECRETS:
        assert lines[secret] == ("****", "env")
    for leaked in ("sk-live-upstream-31337", ADMIN_LIVE, "pg-pass-77", "hook-secret-99"):
        assert leaked not in out.stdout + out.stderr
    assert lines["store.url"] == ("'postgresql://chatgate:****@db:5432/cg'", "file")
    assert str(config) in out.stdout and "configuration is valid" in out.stdout


def test_config_check_without_a_file_shows_defaults() -> None:
    out = chatgate("config", "check")
    assert out.returncode == 0, out.stderr
    assert "(none)" in out.stdout
    assert re.search(r"^auth\.admin_key\s+= None  \[default\]$", out.stdout, re.M)


def test_config_check_names_a_deprecated_setting(tmp_path: Path) -> None:
    config = tmp_path / "old.toml"
    config.write_text("[store]\nturn_flush_interval_ms = 1000.0\n")
    out = chatgate("config", "check", "--config", str(config))
    assert out.returncode == 0, out.stderr
    assert "# store.turn_flush_interval_ms (from file) is deprecated" in out.stdout
    assert "configuration is valid" in out.stdout


# --- bad configs ---------------------------------------------------------------------------------------

BAD_FILES = {
    "unknown key": ("[server]\ncolour = 'blue'\n", "server.colour"),
    "unknown section": ("[telemetry]\nenabled = true\n", "telemetry"),
    "wrong type": ("[server]\nworkers = 'two'\n", "server.workers"),
    "out of range": ("[limits]\nmax_header_bytes = 12\n", "limits.max_header_bytes"),
    "bad URL": ("[upstream]\nbase_url = 'api.deepseek.com'\n", "upstream.base_url"),
    "bad store URL": ("[store]\nurl = 'mysql://root@db/x'\n", "store.url"),
    "bad enum": ("[auth]\nmode = 'open'\n", "auth.mode"),
    "empty peak window": ("[pricing]\npeak_hours_utc = ['01:00-04:00', '10:00-10:00']\n",
                          "pricing.peak_hours_utc"),
    "not TOML": ("[server\nport = 1\n", "config file"),
}
BAD_ENVS = {
    "env wrong type": ({"CHATGATE_SERVER_WORKERS": "two"}, "server.workers"),
    "env bad URL": ({"CHATGATE_UPSTREAM_BASE_URL": "ftp://x"}, "upstream.base_url"),
    "unknown CHATGATE_ env var": ({"CHATGATE_SERVR_PORT": "1"}, "CHATGATE_SERVR_PORT"),
    "unknown key via env": ({"CHATGATE_STORE_COLOUR": "1"}, "store.colour"),
}
COMMANDS = [["serve"], ["config", "check"]]


def assert_one_line_exit_2(code: int | None, stdout: str, stderr: str, setting: str) -> None:
    assert code == 2, (code, stdout, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert setting in lines[0] and lines[0].startswith("chatgate: config error: ")
    assert "Traceback" not in stderr and stdout == ""


@pytest.mark.slow  # 8 CLI processes; test_every_bad_config_file_case runs the cases in this one
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("case", ["unknown key", "wrong type", "bad URL", "not TOML"])
def test_bad_config_file_process_prints_one_line_and_exits_2(tmp_path: Path, command: list[str],
                                                             case: str) -> None:
    """A real process: `chatgate serve|config check --config BAD` -> one line naming the setting, exit 2."""
    text, setting = BAD_FILES[case]
    config = tmp_path / "bad.toml"
    config.write_text(text)
    out = chatgate(*command, "--config", str(config), "--port", str(free_port())) if command == ["serve"] \
        else chatgate(*command, "--config", str(config))
    assert_one_line_exit_2(out.returncode, out.stdout, out.stderr, setting)


@pytest.mark.slow  # 4 CLI processes
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("case", ["unknown CHATGATE_ env var", "env wrong type"])
def test_bad_environment_process_prints_one_line_and_exits_2(tmp_path: Path, command: list[str],
                                                             case: str) -> None:
    env, setting = BAD_ENVS[case]
    out = chatgate(*command, env=env, cwd=tmp_path)
    assert_one_line_exit_2(out.returncode, out.stdout, out.stderr, setting)


class ServerStarted(AssertionError):
    pass


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process `serve` must fail before the server starts; a wrongly accepted case fails here instead of
    binding a port and serving forever. `cmd_serve` starts it through `chatgate.server.run`."""
    from chatgate import server

    def refuse(*args: object, **kwargs: object) -> bool:
        raise ServerStarted("the bad config was accepted: chatgate.server.run was called")
    monkeypatch.setattr(server, "run", refuse)
    monkeypatch.setattr("chatgate.cli._absorb_replayed_stop_signals", lambda: None)  # keep pytest's handlers
    monkeypatch.setenv("_CHATGATE_SERVE_FLAGS", "")  # serve sets it for its workers; restored after the test


def test_the_no_server_guard_stops_a_serve_that_would_start(no_server: None, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The guard itself: with a good config `serve` gets as far as starting the server, and is stopped."""
    for name in [n for n in os.environ if n.startswith("CHATGATE_")]:
        monkeypatch.delenv(name)
    with pytest.raises(ServerStarted):
        main(["serve", "--port", "0", "--store", "none"])


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_every_bad_config_file_case(tmp_path: Path, command: list[str], case: str, no_server: None,
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """All the bad-file cases, through chatgate.cli.main in this process (the processes above prove the
    wiring)."""
    for name in [n for n in os.environ if n.startswith("CHATGATE_")]:
        monkeypatch.delenv(name)
    text, setting = BAD_FILES[case]
    config = tmp_path / "bad.toml"
    config.write_text(text)
    code = main([*command, "--config", str(config)])
    out = capsys.readouterr()
    assert_one_line_exit_2(code, out.out, out.err, setting)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("case", sorted(BAD_ENVS))
def test_every_bad_environment_case(command: list[str], case: str, no_server: None,
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    for name in [n for n in os.environ if n.startswith("CHATGATE_")]:
        monkeypatch.delenv(name)
    env, setting = BAD_ENVS[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main(command)
    out = capsys.readouterr()
    assert_one_line_exit_2(code, out.out, out.err, setting)


def test_missing_config_file_is_one_line_and_exit_2(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["config", "check", "--config", str(tmp_path / "nope.toml")])
    out = capsys.readouterr()
    assert_one_line_exit_2(code, out.out, out.err, "nope.toml")


def test_bad_flag_value_names_the_setting(tmp_path: Path, no_server: None, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    """Flags are validated like the rest: an out-of-range --port is a config error, not a crash."""
    code = main(["serve", "--port", "70000"])
    out = capsys.readouterr()
    assert_one_line_exit_2(code, out.out, out.err, "server.port")


# --- the example config -----------------------------------------------------------------------------------


def test_example_config_loads_and_restates_the_defaults() -> None:
    loaded = load_settings(str(EXAMPLE), env={}, flags={})
    assert loaded.settings == load_settings(None, env={}, flags={}).settings


def test_example_config_names_every_setting() -> None:
    text = EXAMPLE.read_text()
    data = tomllib.loads(text)
    for dotted in all_settings():
        section, key = dotted.split(".")
        default = getattr(getattr(Settings(), section), key)
        # TOML has no null: an unset default is shown commented out, and so is one that is each user's own
        if dotted in SECRETS or default is None or dotted in ("store.url", "store.spool_dir"):
            assert re.search(rf"^# {key} = ", text, re.M), f"{dotted} should be shown commented out"
            assert key not in data.get(section, {}), f"{dotted}: must not be set in the example"
        else:
            assert key in data.get(section, {}), f"{dotted} missing from {EXAMPLE}"
    assert re.search(r'^# \[models\."[^"]+"\]$', text, re.M)
    for key in ModelSettings.model_fields:
        assert re.search(rf"^# {key} = ", text, re.M), f"models.*.{key} missing from the example"


def test_example_config_comments_every_setting() -> None:
    """Each setting line (set or commented out) is directly preceded by a comment explaining it."""
    lines = EXAMPLE.read_text().splitlines()
    setting = re.compile(r"^(# )?[a-z_]+ = ")
    for n, line in enumerate(lines):
        if setting.match(line):
            above = lines[n - 1]
            assert above.startswith("#") and not setting.match(above), f"line {n + 1} has no comment: {line}"


def test_example_config_passes_config_check() -> None:
    out = chatgate("config", "check", "--config", str(EXAMPLE))
    assert out.returncode == 0, out.stderr
    assert "[file]" in out.stdout


# --- --help everywhere --------------------------------------------------------------------------------------


def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += commands(sub, (*prefix, name))
    return found


ALL_COMMANDS = commands(build_parser())


def test_every_command_is_covered() -> None:
    assert {("serve",), ("keys", "create"), ("keys", "list"), ("keys", "revoke"), ("usage",),
            ("config", "check"), ("lint",)} <= set(ALL_COMMANDS)


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=lambda c: " ".join(c) or "chatgate")
def test_help_works_on_every_command(command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: chatgate") and " ".join(command) in out


@pytest.mark.slow  # two CLI processes; test_help_works_on_every_command runs --help in this one
def test_help_as_a_process() -> None:
    out = chatgate("--help")
    assert out.returncode == 0 and "serve" in out.stdout and "lint" in out.stdout
    serve = chatgate("serve", "--help")
    assert serve.returncode == 0 and "--config" in serve.stdout and "127.0.0.1" in serve.stdout
