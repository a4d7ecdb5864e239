"""What `chatgate serve` says as it starts (issue 50 §5, §6, §10): a banner on stderr naming the mode, the
upstream, the store's absolute path, the config file, the dashboard, the admin key's state and tracing; a
warning for managed mode without a DeepSeek key; a port in use named, with `--port`. Real processes."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from chatgate.store.sqlite import SQLiteStore
from tests.config.test_cli_config import chatgate
from tests.harness import spawn_chatgate

pytestmark = pytest.mark.slow

ADMIN = "admin-banner-0123456789abcdef0123456789"


def banner_of(log: str) -> dict[str, str]:
    lines = {}
    for line in log.splitlines():
        if line.startswith("  ") and len(line.split(None, 1)) == 2:
            name, _, value = line.strip().partition("  ")
            lines[name.strip()] = value.strip()
    return lines


def test_the_banner_names_what_serve_runs_with(tmp_path: Path) -> None:
    config = tmp_path / "chatgate.toml"
    config.write_text('[upstream]\nbase_url = "http://127.0.0.1:9"\n[store]\nurl = "sqlite:///usage/cg.db"\n')
    with spawn_chatgate(tmp_path, "--config", str(config), env={"CHATGATE_ADMIN_KEY": ADMIN}) as gate:
        log = gate.log()
    assert f"passthrough mode on http://127.0.0.1:{gate.port}" in log
    lines = banner_of(log)
    assert lines["upstream"] == "http://127.0.0.1:9"
    assert lines["store"] == f"SQLite {tmp_path / 'usage' / 'cg.db'}", "absolute, from the current directory"
    assert lines["config"] == str(config)
    assert lines["dashboard"] == f"http://127.0.0.1:{gate.port}/admin/dashboard"
    assert lines["admin key"] == "set"
    assert lines["tracing"] == "off"
    assert "warning" not in log


def test_managed_mode_without_a_deepseek_key_warns_at_start(tmp_path: Path) -> None:
    env = {"DEEPSEEK_API_KEY": "", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    with spawn_chatgate(tmp_path, "--auth", "managed", "--upstream", "http://127.0.0.1:9", env=env) as gate:
        log = gate.log()
    lines = banner_of(log)
    assert "managed mode on" in log
    assert lines["admin key"].startswith("not set")
    assert lines["config"].startswith("none")
    assert lines["store"] == f"SQLite {tmp_path}/xdg/chatgate/chatgate.db", "the per-user default"
    assert lines["tracing"] == "on"
    assert "warning: managed mode without a DeepSeek key: DEEPSEEK_API_KEY is not set" in log


def test_managed_mode_with_a_key_does_not_warn(tmp_path: Path) -> None:
    with spawn_chatgate(tmp_path, "--auth", "managed", "--upstream", "http://127.0.0.1:9",
                        env={"DEEPSEEK_API_KEY": "sk-banner-house-key"}) as gate:
        log = gate.log()
    assert "managed mode on" in log and "warning" not in log
    assert "sk-banner-house-key" not in log


def test_a_port_in_use_is_named_with_the_way_to_pick_another(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = chatgate("serve", "--port", str(port), "--store", "none", cwd=tmp_path)
    assert out.returncode == 3
    assert f"port {port} on 127.0.0.1 is already in use" in out.stderr
    assert f"--port {port + 1}" in out.stderr
    assert "Errno" not in out.stderr + out.stdout


@pytest.mark.parametrize(("log_format", "pattern"), [
    ("json", r'^\{"event":"log","time":"\d{4}-\d\d-\d\dT[\d:.]+Z","level":"INFO","logger":"uvicorn.error",'
             r'"message":"Uvicorn running on'),
    ("text", r"^\d{4}-\d\d-\d\dT[\d:.]+Z INFO uvicorn.error: Uvicorn running on "),
])
def test_the_log_format_applies_to_every_log_line_of_serve(tmp_path: Path, log_format: str, pattern: str
                                                            ) -> None:
    env = {"CHATGATE_SERVER_LOG_FORMAT": log_format}
    with spawn_chatgate(tmp_path, "--upstream", "http://127.0.0.1:9", env=env) as gate:
        log = gate.log()
    assert any(re.match(pattern, line) for line in log.splitlines()), log


def test_a_store_at_the_old_default_is_served_with_a_notice_to_move_it(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    store = SQLiteStore(work / "data" / "chatgate.db")
    store.migrate()
    store.close()
    with spawn_chatgate(tmp_path, "--upstream", "http://127.0.0.1:9", cwd=work) as gate:
        log = gate.log()
    assert banner_of(log)["store"] == f"SQLite {work}/data/chatgate.db"
    assert f"notice: using the store at the old default place, {work}/data/chatgate.db" in log
    assert f"The default is now {tmp_path}/xdg/chatgate/chatgate.db" in log
    assert not (tmp_path / "xdg").exists()
