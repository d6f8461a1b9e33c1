"""The shape of the code: data flows one way (ingest -> rules -> agents -> store -> API).

Read from the source with `ast`, so an import under `if TYPE_CHECKING:` or inside a function
counts as much as one at the top: a layer that needs a type from above it is still coupled
to it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rules", "agents", "service", "prompts")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Project modules that `name` imports, anywhere in its source."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from service.store import jobs` imports the module service.store.jobs
            targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                       for alias in node.names]
        else:
            continue
        out.update(t for t in targets if t.split(".")[0] in PACKAGES and t != name)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


@pytest.mark.parametrize("layer", ["rules", "agents"])
def test_the_core_never_imports_the_service(layer: str) -> None:
    wrong = {m: sorted(t for t in targets if t.startswith("service"))
             for m, targets in GRAPH.items() if m.split(".")[0] == layer}
    assert {m: t for m, t in wrong.items() if t} == {}


def test_rules_import_nothing_of_the_agents() -> None:
    wrong = {m: sorted(t for t in targets if t.startswith("agents"))
             for m, targets in GRAPH.items() if m.startswith("rules")}
    assert {m: t for m, t in wrong.items() if t} == {}


def test_no_two_modules_import_each_other() -> None:
    pairs = sorted({tuple(sorted((a, b))) for a, targets in GRAPH.items() for b in targets
                    if b in GRAPH and a in GRAPH[b]})
    assert pairs == []


def test_the_service_top_level_holds_at_most_a_dozen_modules() -> None:
    top = sorted(p.name for p in (ROOT / "service").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 12, top


SHARED_WITH_THE_SIDECAR = {"rules.error_files"}
"""Core modules written with the standard library alone, which the sidecar may use too."""


def test_the_sidecar_imports_nothing_of_the_server() -> None:
    """It runs on every training node: it must not need the server's dependencies."""
    wrong = {m: sorted(t for t in targets if not t.startswith("service.sidecar") and t not in SHARED_WITH_THE_SIDECAR)
             for m, targets in GRAPH.items() if m.startswith("service.sidecar")}
    assert {m: t for m, t in wrong.items() if t} == {}


@pytest.mark.parametrize("name", sorted(SHARED_WITH_THE_SIDECAR))
def test_what_the_sidecar_shares_needs_only_the_standard_library(name: str) -> None:
    tree = ast.parse(MODULES[name].read_text())
    roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert roots - {"__future__"} <= sys.stdlib_module_names, roots
    package = ast.parse((ROOT / name.split(".")[0] / "__init__.py").read_text())
    assert not [n for n in ast.walk(package) if isinstance(n, (ast.Import, ast.ImportFrom))], "its package imports nothing"
