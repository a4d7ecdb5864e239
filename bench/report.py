"""Result model and the markdown / JSON report (bench/results/latest.md, latest.json)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["PASS", "FAIL", "SKIP", "INFO"]


@dataclass
class Check:
    """One target line: a value compared with its target."""

    name: str
    value: str
    target: str
    status: Status
    detail: str = ""


@dataclass
class Column:
    key: str
    header: str
    fmt: str = "{:.2f}"


@dataclass
class ScenarioResult:
    key: str
    title: str
    columns: list[Column]
    rows: dict[str, dict[str, float]] = field(default_factory=dict)  # target -> metric -> median
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # target -> one dict per rep
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool | None, value: str, target: str, detail: str = "") -> None:
        status: Status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        self.checks.append(Check(name, value, target, status, detail))

    def skip(self, name: str, target: str, why: str) -> None:
        self.checks.append(Check(name, "—", target, "SKIP", why))


def fmt_num(value: Any, fmt: str = "{:.2f}") -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and math.isnan(value):
        return "—"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def render_markdown(meta: dict[str, Any], scenarios: list[ScenarioResult]) -> str:
    out: list[str] = ["# chatgate benchmark", ""]
    out.append(
        f"Mode **{meta['mode']}**, {meta['reps']} repetition(s) per measurement (medians shown), "
        f"{meta['started']}, commit `{meta['commit']}`, {meta['machine']}; {meta.get('elapsed_s', '?')} s; "
        f"load average (1/5/15 min) {meta.get('load_average_start', '?')} at start, "
        f"{meta.get('load_average_end', '?')} at end."
    )
    out.append(
        "All targets of a scenario run round-robin within each repetition in this same run; ratios compare "
        "numbers measured side by side. Load generators run on the same cores as the servers."
    )
    for error in meta.get("errors", []):
        out.append(f"**Error:** {error}")
    out.append("")
    out.append("## Targets")
    out.append("")
    all_checks = [(s, c) for s in scenarios for c in s.checks]
    counts = {k: sum(1 for _, c in all_checks if c.status == k) for k in ("PASS", "FAIL", "SKIP")}
    out.append(f"{counts['PASS']} pass, {counts['FAIL']} fail, {counts['SKIP']} skipped.")
    out.append("")
    out += _table(
        ["scenario", "check", "value", "target", "result"],
        [[s.key, c.name, c.value, c.target, f"**{c.status}**"] for s, c in all_checks],
    )
    for s in scenarios:
        out += ["", f"## {s.key}. {s.title}", ""]
        if s.rows:
            headers = ["target"] + [c.header for c in s.columns]
            rows = [
                [name] + [fmt_num(vals.get(c.key), c.fmt) for c in s.columns] for name, vals in s.rows.items()
            ]
            out += _table(headers, rows)
            out.append("")
        for c in s.checks:
            detail = f" ({c.detail})" if c.detail else ""
            out.append(f"- **{c.status}** {c.name}: {c.value} (target {c.target}){detail}")
        for note in s.notes:
            out.append(f"- note: {note}")
    out.append("")
    return "\n".join(out)


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_reports(out_dir: Path, meta: dict[str, Any], scenarios: list[ScenarioResult]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path = out_dir / "latest.md"
    json_path = out_dir / "latest.json"
    md_path.write_text(render_markdown(meta, scenarios))
    payload = {"meta": meta, "scenarios": [asdict(s) for s in scenarios]}
    json_path.write_text(json.dumps(_clean(payload), indent=1))
    return md_path, json_path
