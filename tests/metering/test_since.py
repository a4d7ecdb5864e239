"""`--since` / `--until` (issue 50 §10): besides dates, datetimes and unix seconds, a span back from now
(`24h`, `7d`, `2w`) and `today` / `yesterday` (from 00:00 UTC), in every report command; anything else is
refused with the forms it takes."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import httpx2
import pytest

from chatgate.cli import main
from chatgate.metering.reports import ReportError, parse_time
from tests.fakes.server import run_fake_deepseek
from tests.gateway.conftest import usage_rows
from tests.harness import make_settings, run_chatgate

NOW = dt.datetime(2026, 12, 7, 17, 30, 15, tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize(("value", "expected"), [
    ("24h", NOW - 86_400), ("1h", NOW - 3600), ("7d", NOW - 7 * 86_400), ("2w", NOW - 14 * 86_400),
    ("7D", NOW - 7 * 86_400),
    ("today", dt.datetime(2026, 12, 7, tzinfo=dt.UTC).timestamp()),
    ("Today", dt.datetime(2026, 12, 7, tzinfo=dt.UTC).timestamp()),
    ("yesterday", dt.datetime(2026, 12, 6, tzinfo=dt.UTC).timestamp()),
    ("2026-11-30", dt.datetime(2026, 11, 30, tzinfo=dt.UTC).timestamp()),
    ("2026-11-30T08:00+08:00", dt.datetime(2026, 11, 30, tzinfo=dt.UTC).timestamp()),
    ("1764460800", 1764460800.0),
])
def test_the_forms_since_takes(value: str, expected: float) -> None:
    assert parse_time(value, "since", now=NOW) == expected


@pytest.mark.parametrize("value", ["7 days", "-7d", "7m", "d", "last week", "1.5d", "tomorrow", "7d ago"])
def test_anything_else_is_refused_with_the_forms_it_takes(value: str) -> None:
    with pytest.raises(ReportError) as refused:
        parse_time(value, "since", now=NOW)
    message = str(refused.value)
    assert message.startswith("--since:") and repr(value) in message
    assert "24h, 7d, 2w" in message and "today" in message and "2026-11-30" in message


@pytest.mark.parametrize("command", [["usage"], ["cache"], ["refusals", "list"]], ids=" ".join)
def test_every_report_refuses_a_bad_since_before_reading_a_store(
        command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--since", "7 days", "--store", f"sqlite:///{tmp_path}/none.db"]) == 2
    err = capsys.readouterr().err
    assert "--since: expected" in err and "24h, 7d, 2w" in err
    assert not (tmp_path / "none.db").exists()


def test_spans_select_the_records_in_every_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with run_fake_deepseek() as fake, run_chatgate(make_settings(tmp_path, fake.url)) as gate:
        body = {"model": "deepseek-flash", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        resp = httpx2.post(gate.url + "/v1/chat/completions", json=body, timeout=20,
                           headers={"authorization": "Bearer sk-since-spans"})
        assert resp.status_code == 200, resp.text
        refused = httpx2.post(gate.url + "/v1/chat/completions", timeout=20, json={**body, "messages": []},
                              headers={"authorization": "Bearer sk-since-spans"})
        assert refused.status_code == 400
        usage_rows(tmp_path, 2)
    store = f"sqlite:///{tmp_path}/usage.db"

    def requests(*args: str) -> int:
        assert main(["usage", "--format", "json", "--store", store, *args]) == 0
        return int(json.loads(capsys.readouterr().out)["totals"]["requests"])

    assert requests("--since", "1h") == 2
    assert requests("--since", "7d", "--until", "1h") == 0
    assert requests("--until", "2w") == 0
    assert main(["cache", "--format", "json", "--store", store, "--since", "24h"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["requests"] >= 1
    assert main(["refusals", "list", "--format", "json", "--store", store, "--since", "24h"]) == 0
    assert len(json.loads(capsys.readouterr().out)["data"]) == 1
