"""Reports read a store, never create one (issue 50 §3): a missing SQLite file is named with the way to
point at the right one (exit 1, nothing created in the current directory); every report names the store it
read on stderr (stdout stays the report), and says when the store holds nothing for the period."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from app.cli import main
from app.store.sqlite import SQLiteStore
from tests.fakes.server import run_fake_deepseek
from tests.gateway.conftest import usage_rows
from tests.harness import make_settings, run_chatgate
from tests.metering.helpers import cli

REPORTS = [["usage"], ["usage", "--by", "model", "--format", "json"], ["cache", "--format", "json"],
           ["refusals", "list"], ["refusals", "show", "req-x"]]


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty current directory, no CHATGATE_* settings from outside."""
    for name in [n for n in os.environ if n.startswith("CHATGATE_")]:
        monkeypatch.delenv(name)
    work = tmp_path / "elsewhere"
    work.mkdir()
    monkeypatch.chdir(work)
    yield work


@pytest.mark.parametrize("command", REPORTS, ids=lambda c: " ".join(c))
def test_a_report_run_elsewhere_names_the_missing_store_and_creates_nothing(
        elsewhere: Path, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(command) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert f"no store at {elsewhere / 'data' / 'chatgate.db'}" in err
    assert "the default" in err and f"relative to the current directory {elsewhere}" in err
    assert "--store" in err and "CHATGATE_STORE_URL" in err and "config file" in err
    assert list(elsewhere.iterdir()) == [], "nothing created"


def test_a_missing_store_given_by_the_environment_says_so(elsewhere: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CHATGATE_STORE_URL", f"sqlite:///{tmp_path}/gone/usage.db")
    assert main(["usage"]) == 1
    err = capsys.readouterr().err
    assert f"no store at {tmp_path}/gone/usage.db" in err and "from the env" in err
    assert "relative to" not in err
    assert not (tmp_path / "gone").exists()


def test_an_empty_store_is_named_and_said_empty_for_the_period(elsewhere: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "empty.db"
    SQLiteStore(db).migrate()
    url = f"sqlite:///{db}"
    assert main(["usage", "--format", "json", "--store", url, "--since", "2026-11-01",
                 "--until", "2026-12-01"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["rows"] == []
    assert f"chatgate: store SQLite {db}" in err
    assert (f"the store SQLite {db} holds no usage records from 2026-11-01T00:00:00Z to "
            "2026-12-01T00:00:00Z") in err
    assert main(["cache", "--store", url]) == 0
    assert "holds no usage records from the first record to now" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == [], "no spool directory either"


def test_a_report_of_records_names_its_store_and_keeps_stdout_clean(
        elsewhere: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with run_fake_deepseek() as fake, run_chatgate(make_settings(tmp_path, fake.url)) as gate:
        body = {"model": "deepseek-flash", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        resp = httpx2.post(gate.url + "/v1/chat/completions", json=body, timeout=20,
                           headers={"authorization": "Bearer sk-report-store"})
        assert resp.status_code == 200, resp.text
        usage_rows(tmp_path, 1)
    store = f"sqlite:///{tmp_path}/usage.db"
    assert main(["usage", "--by", "model", "--format", "json", "--store", store]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["totals"]["requests"] == 1
    assert err.strip() == f"chatgate: store SQLite {tmp_path}/usage.db"


@pytest.mark.slow
def test_the_real_cli_run_elsewhere_exits_non_zero_and_leaves_no_data_directory(tmp_path: Path) -> None:
    env = {"CHATGATE_STORE_SPOOL_DIR": "data/spool"}  # the defaults, relative to the current directory
    proc = cli("usage", "--by", "team", cwd=tmp_path, env=env, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"no store at {tmp_path}/data/chatgate.db" in proc.stderr
    assert not (tmp_path / "data").exists()
