"""The package layout is the architecture: no import cycles, and each layer imports only from the layers
below it (LAYERS below). Read from the source with `ast`, imports inside functions included."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "chatgate"

# Top to bottom; a module may import from its own layer's package and from any lower layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("chatgate.__main__",),
    ("chatgate.cli",),  # the entry points: the CLI, which runs the uvicorn runner and the offline lint
    # the uvicorn runner, the offline lint, the start-up banner
    ("chatgate.server", "chatgate.lint", "chatgate.banner"),
    ("chatgate.uvicorn_protocol",),  # the runner's HTTP protocol: uvicorn's, with a bounded request head
    # `chatgate demo`'s offline stand-in for DeepSeek (the tests' upstream too): imports nothing of chatgate
    ("chatgate.demo",),
    ("chatgate.web",),
    ("chatgate.files",),  # the Files API: its routes and relay, above the gateway they use
    ("chatgate.gateway",),
    # the gateway's file-ownership step, which asks the owners and the file ids below
    ("chatgate.files.ownership",),
    # who owns each uploaded file, and which files a request names: asked by the Files routes and the gateway
    ("chatgate.files.owners", "chatgate.files.file_ids"),
    ("chatgate.runs",),  # agent runs: which run each request is in, its bounds, its store rows
    # OpenTelemetry spans; the refusal inspector (its store, its views); the rules' evidence from DeepSeek
    ("chatgate.tracing", "chatgate.refusals", "chatgate.confirmation"),
    ("chatgate.quotas",),
    ("chatgate.settings",),
    ("chatgate.fim",),  # the FIM completion family, built on the OpenAI family's wire pieces
    # the model families, and the tool APIs (search, fetch, OCR, TTS, ASR)
    ("chatgate.openai", "chatgate.anthropic", "chatgate.responses", "chatgate.tools"),
    # what the gateway needs from a family, and the base with its defaults that the families build on
    ("chatgate.gateway.family",),
    ("chatgate.repair",),  # the repairs' vocabulary and the memory of relayed turns, shared by the families
    ("chatgate.metering",),
    # where keys, usage, limits, turns, file owners and alerts live: SQLite or PostgreSQL
    ("chatgate.store",),
    # the rules kernel below every family: a rule's type, running rules, served models, the catalogue
    ("chatgate.rules",),
    ("chatgate.verdict", "chatgate.wire", "chatgate.sse"),  # what a family's rules found; pydantic errors as
    # problems; scanning relayed SSE bytes
    ("chatgate.profiles", "chatgate.errors", "chatgate.ids", "chatgate"),
)
FAMILIES = ("chatgate.openai", "chatgate.anthropic", "chatgate.responses")


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "chatgate" or name.startswith("chatgate.")}


@functools.cache  # read once for the four tests (parsing every module of chatgate/ took ~0.6 s of CPU)
def graph() -> dict[str, frozenset[str]]:
    modules = {module_name(p): p for p in APP.rglob("*.py")}
    return {name: frozenset(m for m in imports_of(path) if m in modules and m != name)
            for name, path in modules.items()}


def layer_of(module: str) -> tuple[int, str]:
    best: tuple[int, str] | None = None
    for depth, layer in enumerate(LAYERS):
        for package in layer:
            if (module == package or module.startswith(package + ".")) and (
                    best is None or len(package) > len(best[1])):
                best = (depth, package)
    assert best is not None, f"{module} is in no layer of tests/test_layout.py"
    return best


def test_every_module_belongs_to_a_layer() -> None:
    for module in graph():
        layer_of(module)


def test_imports_go_down_the_layers_only() -> None:
    wrong = []
    for module, imported in graph().items():
        depth, package = layer_of(module)
        for target in imported:
            target_depth, target_package = layer_of(target)
            if target_depth < depth or (target_depth == depth and target_package != package):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_api_families_never_import_each_other() -> None:
    for module, imported in graph().items():
        _, package = layer_of(module)
        if package in FAMILIES:
            assert not [t for t in imported if layer_of(t)[1] in FAMILIES and layer_of(t)[1] != package]


def test_no_import_cycles() -> None:
    edges = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []
