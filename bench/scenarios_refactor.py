"""Scenario 12 (issue 13): the chat route keeps its speed across the API-family refactor.

"before" is the source tree at BEFORE_COMMIT, extracted with `git archive` into the bench workdir (no
worktree metadata left in the repository) and run with that tree as cwd, on this venv's Python, as
`python -m app serve` (a tree from before the rename to `chatgate`): `python -m` puts the cwd first on
sys.path, ahead of the editable install's finder, so that tree's package is imported (checked: its
`__file__` in a subprocess, the server's /proc cwd, and a route added since answering 404 there). "after"
is the current tree (this checkout, uncommitted edits included), run the same way from the repository. Same
flags: passthrough, a SQLite store each. Full runs add the refactor commit itself ("at-refactor"), for
information: is a difference the refactor's or a later change's?
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import PACKAGES, REPO_DIR, package_of, request_once, warm_up
from bench.measure import (
    Context,
    added,
    alternating,
    round_ratios,
    round_robin,
    spread,
    wrk_measure,
    wrk_sample,
)
from bench.report import Column, ScenarioResult
from bench.stats import median
from bench.targets import DIRECT, Cluster, Target, TargetSpec, UpstreamSpec

# The refactor is 0a28b14 "The gateway serves API families through one interface
# (chatgate/gateway/family.py)"; issue 13 asks that the chat route keep its speed across it, so "before" is
# its parent. A constant, not "HEAD~n": the comparison must not move as commits land.
REFACTOR_COMMIT = "0a28b14"
BEFORE_COMMIT = REFACTOR_COMMIT + "~1"
BEFORE, AFTER, AT_REFACTOR = "chatgate-before", "chatgate-after", "chatgate-at-refactor"
PAIR_FACTOR = 3
RATIO = 0.95
# A route added after the refactor (8fb9374, Anthropic): the old tree must answer it 404, the current not.
PROBE_PATH = "/anthropic/v1/messages/count_tokens"
PROBE_BODY = b'{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hi"}]}'


def materialize(commit: str, dest: Path) -> tuple[str | None, str]:
    """Extract the package of `commit` (`chatgate/`, or `app/` before the rename) into dest with git archive:
    (problem or None, the full commit id)."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO_DIR), "rev-parse", "--verify", "--quiet", commit + "^{commit}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"git is not usable: {exc}", ""
    sha = rev.stdout.strip()
    if rev.returncode != 0 or not sha:
        return f"commit {commit} is not in {REPO_DIR} (shallow clone or another history?)", ""
    listed = subprocess.run(
        ["git", "-C", str(REPO_DIR), "ls-tree", "--name-only", sha, "--", *PACKAGES],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout.split()
    package = next((name for name in PACKAGES if name in listed), None)
    if package is None:
        return f"commit {sha[:12]} has none of {', '.join(p + '/' for p in PACKAGES)}", sha
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(
        ["git", "-C", str(REPO_DIR), "archive", "--format=tar", sha, package], stdout=subprocess.PIPE
    )
    tar = subprocess.run(
        ["tar", "-x", "-C", str(dest)], stdin=archive.stdout, capture_output=True, check=False
    )
    if archive.stdout is not None:
        archive.stdout.close()
    if archive.wait(timeout=60) != 0 or tar.returncode != 0:
        return f"git archive {sha[:12]} | tar -x failed: {tar.stderr.decode(errors='replace')[-300:]}", sha
    return None, sha


def imported_from(tree: Path) -> str:
    """Where the tree's package (package_of) resolves with this Python and cwd = tree (what `python -m`
    will run)."""
    package = package_of(tree)
    out = subprocess.run(
        [sys.executable, "-c", f"import {package}; print({package}.__file__)"],
        cwd=str(tree),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return out.stdout.strip() or f"(failed: {out.stderr[-200:]})"


def _rounds(ctx: Context) -> int:
    return 1 if ctx.settings.quick else ctx.settings.reps * PAIR_FACTOR


def refactor(ctx: Context) -> ScenarioResult:
    s = ctx.settings
    res = ScenarioResult(
        "12",
        f"the chat route before/after the API-family refactor ({REFACTOR_COMMIT}): before = {BEFORE_COMMIT}, "
        "after = this checkout",
        [
            Column("c16_rps", "c=16 req/s", "{:.0f}"),
            Column("c16_ratio", "x before", "{:.3f}"),
            Column("c16s_rps", "c=16 stream req/s", "{:.0f}"),
            Column("c16s_ratio", "x before", "{:.3f}"),
            Column("p50_ms", "c=1 p50 ms", "{:.3f}"),
            Column("added_p50_ms", "c=1 added p50 ms", "{:.3f}"),
        ],
    )
    checks = [("c16_", "after / before req/s at c=16"), ("c16s_", "after / before req/s at c=16, streaming")]
    trees = {BEFORE: (BEFORE_COMMIT, ctx.workdir / "tree-before")}
    if not s.quick:
        trees[AT_REFACTOR] = (REFACTOR_COMMIT, ctx.workdir / "tree-at-refactor")
    shas: dict[str, str] = {}
    for name, (commit, tree) in list(trees.items()):
        problem, sha = materialize(commit, tree)
        if problem is None:
            where = imported_from(tree)
            if not where.startswith(str(tree)):
                problem = (f"`import {package_of(tree)}` with cwd {tree} resolves to {where}, not to the "
                           "extracted tree")
        if problem is not None:
            if name == BEFORE:
                for _, check in checks:
                    res.skip(check, f"≥ {RATIO:g}", problem)
                return res
            res.notes.append(f"{name} left out: {problem}")
            del trees[name]
            break
        shas[name] = sha
    specs = [DIRECT, TargetSpec(BEFORE, "chatgate", source_dir=str(trees[BEFORE][1]))]
    specs.append(TargetSpec(AFTER, "chatgate", source_dir=str(REPO_DIR)))
    if AT_REFACTOR in trees:
        specs.append(TargetSpec(AT_REFACTOR, "chatgate", source_dir=str(trees[AT_REFACTOR][1])))
    ready = ctx.bodies["small"].read_bytes()
    with Cluster("refactor", UpstreamSpec(), specs, ctx.workdir, ready, ctx.chatgate_problem) as cl:
        names = [spec.name for spec in specs if spec.is_chatgate]
        targets = cl.live(names)
        if BEFORE not in {t.name for t in targets} or AFTER not in {t.name for t in targets}:
            why = "; ".join(f"{k}: {v}" for k, v in cl.skipped(names).items()) or "not started"
            for _, check in checks:
                res.skip(check, f"≥ {RATIO:g}", why)
            return res
        verified_ok, verified = _verify(targets, trees)
        small, stream = ctx.bodies["small"].read_bytes(), ctx.bodies["small_stream"].read_bytes()
        for t in targets:
            warm_up(t.port, [small, stream], 100 if s.quick else 200)
            if not s.quick:
                wrk_sample(t, ctx.bodies["small"], 16, 1)
        per_config: dict[str, list[dict[str, dict[str, Any]]]] = {}
        for tag, body in (("c16_", ctx.bodies["small"]), ("c16s_", ctx.bodies["small_stream"])):
            measure: Callable[[Target], dict[str, Any]] = wrk_measure(body, 16, s.wrk_seconds)
            per_config[tag] = alternating(ctx, res, targets, measure, tag, _rounds(ctx))
        if s.quick:
            res.columns = res.columns[:4]
            res.notes.append("quick mode: c=1 latency left out")
        else:
            round_robin(
                ctx, res, cl.live(["direct", *names]), wrk_measure(ctx.bodies["small"], 1, s.wrk_seconds)
            )
            for name in names:
                if name in res.rows:
                    res.rows[name]["added_p50_ms"] = added(res, name, "p50_ms") or 0.0
    for tag, check in checks:
        for name in names:
            ratios = round_ratios(per_config[tag], name, BEFORE, "rps")
            if ratios and name in res.rows:
                res.rows[name][tag + "ratio"] = median(ratios)
        ratios = round_ratios(per_config[tag], AFTER, BEFORE, "rps")
        if not ratios:
            res.skip(check, f"≥ {RATIO:g}", "no measurement")
            continue
        r = median(ratios)
        a, b = res.rows[AFTER][tag + "rps"], res.rows[BEFORE][tag + "rps"]
        detail = f"{spread(ratios, '{:.3f}')}; {a:.0f} vs {b:.0f} req/s"
        if AT_REFACTOR in res.rows and tag + "ratio" in res.rows[AT_REFACTOR]:
            detail += f"; at the refactor itself: {res.rows[AT_REFACTOR][tag + 'ratio']:.3f}x before"
        res.check(check, r >= RATIO, f"{r:.3f}", f"≥ {RATIO:g}", detail)
    if not s.quick and AFTER in res.rows and BEFORE in res.rows:
        d = res.rows[AFTER].get("p50_ms", float("nan")) - res.rows[BEFORE].get("p50_ms", float("nan"))
        res.notes.append(
            f"c=1 p50, after minus before: {d:+.3f} ms (information; added = p50 - direct's p50)"
        )
    errors = {n: sum(int(x.get("errors", 0)) for x in smp) for n, smp in res.samples.items()}
    if any(errors.values()):
        res.notes.append(f"wrk errors (all configs, all rounds): {errors}")
    res.notes.append(
        "trees: "
        + ", ".join(f"{n} = {shas[n][:12]} ({trees[n][0]})" for n in trees)
        + f", {AFTER} = the checkout at {REPO_DIR} (uncommitted edits included)"
    )
    res.check(
        "each target runs its own tree",
        verified_ok,
        "yes" if verified_ok else "no",
        "old trees: cwd = tree, a later route 404",
        verified,
    )
    res.notes.append(
        f"{_rounds(ctx)} round(s) per configuration, the order rotated every round; a ratio is the median of "
        "the per-round ratios. Each target: `python -m chatgate serve --auth passthrough --store sqlite:///…`"
        " (`python -m app` for a tree from before the rename)"
    )
    return res


def _verify(targets: list[Target], trees: dict[str, tuple[str, Path]]) -> tuple[bool, str]:
    """Which code each server runs: its /proc cwd, and a route added after the refactor (404 on old trees)."""
    parts = []
    all_ok = True
    for t in targets:
        cwd = "?"
        if t.proc is not None:
            with contextlib.suppress(OSError):
                cwd = str(Path(f"/proc/{t.proc.pid}/cwd").resolve())
        try:
            status = str(request_once(t.port, "POST", PROBE_PATH, PROBE_BODY)[0])
        except OSError as exc:
            status = f"error {exc}"
        tree = trees[t.name][1] if t.name in trees else REPO_DIR
        ok = (status == "404") == (t.name in trees) and cwd == str(tree.resolve())
        all_ok = all_ok and ok
        parts.append(f"{t.name}: cwd {cwd}, POST {PROBE_PATH} → {status}{'' if ok else ' (UNEXPECTED)'}")
    return all_ok, "; ".join(parts)
