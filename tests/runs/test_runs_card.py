"""The dashboard's Agent runs card in headless Chromium: each run a row, its context growth a line."""

from __future__ import annotations

import re
from pathlib import Path

from tests.fakes.server import run_fake_deepseek
from tests.harness import ADMIN_KEY, make_settings, run_chatgate
from tests.runs.test_runs import chat_loop, runs_of
from tests.web.test_dashboard import ARTIFACTS, chromium


def test_the_runs_card_draws_each_runs_context_growth(tmp_path: Path) -> None:
    with run_fake_deepseek() as fake, run_chatgate(make_settings(tmp_path, fake.url,
                                                                 auth={"admin_key": ADMIN_KEY})) as gate:
        chat_loop(gate.url, "sk-card", "Fix the failing test", 6, {"x-chatgate-run": "card-run"})
        chat_loop(gate.url, "sk-card", "Rename the module", 3)
        runs = {r["run_id"]: r for r in runs_of(gate.url)}
        url = f"{gate.url}/admin/dashboard#key={ADMIN_KEY}"
        dom = chromium(tmp_path, "--dump-dom", url).stdout
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "dashboard-runs.png"
        chromium(tmp_path / "shot", f"--screenshot={shot}", "--window-size=1280,2600", url)
    assert len(runs) == 2
    card = dom[dom.index('id="runs-card"'):]
    rows = re.findall(r'<tr data-run="([^"]+)">(.*?)</tr>', card)
    assert sorted(run_id for run_id, _ in rows) == sorted(runs)
    row = dict(rows)["card-run"]
    assert "read_file\u00d73" in row and "<polyline" in row
    points = re.search(r'<polyline points="([^"]+)"', row)
    assert points is not None and len(points.group(1).split()) == 6  # one point per answered request
    ys = [float(p.split(",")[1]) for p in points.group(1).split()]
    assert ys == sorted(ys, reverse=True)  # the context grows: the line rises (SVG's y goes down)
    assert shot.stat().st_size > 10_000
