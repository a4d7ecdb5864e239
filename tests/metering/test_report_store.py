"""Reports read a store, never create one (issue 50 §3): a missing SQLite file is named with the way to
point at the right one (exit 1, nothing created); every report names the store it read on stderr (stdout
stays the report), and says when the store holds nothing for the period. The default store is in the
per-user data directory, whatever the current directory; one at the old default, ./data/chatgate.db, is
still read, with a notice to move it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from chatgate.cli import main
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import run_fake_deepseek
from tests.gateway.conftest import usage_rows
from tests.harness import make_settings, run_chatgate, spawn_chatgate
from tests.metering.helpers import cli, wait_for

REPORTS = [["usage"], ["usage", "--by", "model", "--format", "json"], ["cache", "--format", "json"],
           ["refusals", "list"], ["refusals", "show", "req-x"]]


def empty_store(path: Path) -> None:
    store = SQLiteStore(path)
    store.migrate()
    store.close()


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty current directory, no CHATGATE_* settings from outside, the data directory under tmp_path."""
    for name in [n for n in os.environ if n.startswith("CHATGATE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    work = tmp_path / "elsewhere"
    work.mkdir()
    monkeypatch.chdir(work)
    yield work


@pytest.mark.parametrize("command", REPORTS, ids=lambda c: " ".join(c))
def test_a_report_without_a_store_names_the_missing_one_and_creates_nothing(
        elsewhere: Path, tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(command) == 1
    out, err = capsys.readouterr()
    assert out == ""
    default = tmp_path / "xdg" / "chatgate" / "chatgate.db"
    assert f"no store at {default} (store.url = sqlite:///{default}, the default)" in err
    assert "--store" in err and "CHATGATE_STORE_URL" in err and "config file" in err
    assert list(elsewhere.iterdir()) == [], "nothing created"
    assert not (tmp_path / "xdg").exists()


def test_a_relative_store_url_is_named_with_the_current_directory(
        elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", "--store", "sqlite:///usage/x.db"]) == 1
    err = capsys.readouterr().err
    assert f"no store at {elsewhere}/usage/x.db (store.url = sqlite:///usage/x.db, from the flag, relative " \
           f"to the current directory {elsewhere})" in err
    assert list(elsewhere.iterdir()) == []


def test_the_default_store_is_the_same_from_any_directory(elsewhere: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    default = tmp_path / "xdg" / "chatgate" / "chatgate.db"
    default.parent.mkdir(parents=True)
    empty_store(default)
    for where in (elsewhere, tmp_path):
        os.chdir(where)
        assert main(["usage", "--format", "json"]) == 0
        assert f"chatgate: store SQLite {default}\n" in capsys.readouterr().err


def test_a_store_at_the_old_default_is_read_with_a_notice_to_move_it(
        elsewhere: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (elsewhere / "data").mkdir()
    empty_store(elsewhere / "data" / "chatgate.db")
    assert main(["usage", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["rows"] == []
    assert f"chatgate: store SQLite {elsewhere}/data/chatgate.db\n" in err
    new = tmp_path / "xdg" / "chatgate"
    assert f"notice: using the store at the old default place, {elsewhere}/data/chatgate.db" in err
    assert f"The default is now {new}/chatgate.db" in err and f"mv {elsewhere}/data/chatgate.db*" in err
    assert not new.exists()


def test_a_missing_store_given_by_the_environment_says_so(elsewhere: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CHATGATE_STORE_URL", f"sqlite:///{tmp_path}/gone/usage.db")
    assert main(["usage"]) == 1
    err = capsys.readouterr().err
    gone = f"{tmp_path}/gone/usage.db"
    assert f"no store at {gone} (store.url = sqlite:///{gone}, from the env)" in err
    assert "relative to" not in err
    assert not (tmp_path / "gone").exists()


def test_an_empty_store_is_named_and_said_empty_for_the_period(elsewhere: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "empty.db"
    empty_store(db)
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
def test_serve_and_a_report_meet_at_the_default_store_from_different_directories(tmp_path: Path) -> None:
    """The real processes: `serve` started in one directory writes the default store, a report run in
    another reads it; neither leaves a data/ directory behind."""
    xdg, served, elsewhere = tmp_path / "xdg", tmp_path / "served", tmp_path / "elsewhere"
    served.mkdir()
    elsewhere.mkdir()
    env = {"XDG_DATA_HOME": str(xdg)}
    with run_fake_deepseek() as fake, spawn_chatgate(tmp_path, "--upstream", fake.url, cwd=served,
                                                      env=env) as gate:
        body = {"model": "deepseek-flash", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        resp = httpx2.post(gate.url + "/v1/chat/completions", json=body, timeout=20,
                           headers={"authorization": "Bearer sk-default-store"})
        assert resp.status_code == 200, resp.text
        assert f"SQLite {xdg}/chatgate/chatgate.db" in gate.log()
        wait_for(lambda: json.loads(cli("usage", "--format", "json", cwd=elsewhere, env=env).stdout)
                 ["totals"]["requests"] == 1, what="the record, read from another directory")
    assert not (served / "data").exists() and not (elsewhere / "data").exists()
