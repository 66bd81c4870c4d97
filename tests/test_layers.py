"""Dependencies point one way: each package of `reef` imports only packages of its own layer or
below, counting imports inside functions and under `TYPE_CHECKING`, so no cycle hides behind a lazy
import. The layers, lowest first, follow the data flow (see docs/architecture.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import reef

pytestmark = pytest.mark.model_free

ROOT = Path(reef.__file__).parent

# Lowest first. A module of layer i may import layers 0..i. Top-level modules count as their own
# package (`reef.server` is the package "server").
LAYERS: list[str] = [
    "core",          # durable files, state tables, crash points, hashing, clocks, the data-dir layout
    "scenario",      # the scenario contract: schema, tasks, rewards, environments, discovery
    "config",        # serve.yaml and params.yaml: one pydantic schema
    "engine",        # the vLLM process: supervise it, load weights and adapters into it
    "experience",    # what the gateway records: WAL, shards, store, readers
    "registry",      # artifacts, release chains and candidates on disk (`Candidate`: what a recipe makes)
    "sampling",      # asking a model: one completion type, transformers and engine backends, episodes
    "recipe",        # the recipe contract: snapshots, ledger, training examples, the Recipe base
    "gate",          # the one evaluator and the gate's decision; `reef scenario check`
    "serving",       # the control plane: publisher, swap, routing, adapters, canaries
    "learn",         # the round orchestrator, the learner, the DVC pipeline
    "model",         # the embedded default model: SmolLM2-135M-Instruct from its wheel
    "gateway",       # the HTTP server: routes, wire types, transport to the upstream
    "server",        # `reef serve`: engine + store + gateway + learner wired together
    "serve_process", # `reef serve` as a child process (demo, tests, benches)
    "client",        # the release API's Python client
    "traffic",       # simulated users and offline traffic
    "cli",           # the `reef` command
    "demo",          # `make demo`: examples/sentiment on the default model, live
    "__init__",      # the public API (`from reef import Scenario`)
]


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_of(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1] if len(parts) > 2 else [*parts[:-1], "__init__"]
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """Every `reef` module a file imports, wherever the import statement stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name == "reef" or name.startswith("reef.")]


def edges() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> where."""
    out: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(ROOT.rglob("*.py")):
        source = package_of(module_of(path))
        for line, name in imports(path):
            target = package_of(name) if name != "reef" else "__init__"
            if target != source:
                out[source][target].append(f"{path.relative_to(ROOT.parent)}:{line} imports {name}")
    return out


def test_every_package_has_a_layer() -> None:
    packages = {package_of(module_of(p)) for p in ROOT.rglob("*.py")}
    assert sorted(packages - set(LAYERS)) == []
    assert sorted(set(LAYERS) - packages) == []


def test_no_import_points_up_a_layer() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = [where for source, targets in edges().items() for target, places in targets.items()
              if rank[target] > rank[source] for where in places]
    assert upward == []


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in a directed graph, as the packages along it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_cycle_between_packages() -> None:
    graph = {source: set(targets) for source, targets in edges().items()}
    assert find_cycle(graph) is None


def test_the_cycle_finder_can_fail() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


def test_the_checker_sees_lazy_imports(tmp_path: Path) -> None:
    """An import inside a function or under TYPE_CHECKING counts too (the scan must be able to fail)."""
    sample = tmp_path / "m.py"
    sample.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from reef.gate import x\n"
                      "def f():\n    from reef.gateway.wire import headers\n    import reef.gateway\n")
    assert [name for _, name in imports(sample)] == ["reef.gate", "reef.gateway.wire", "reef.gateway"]


def test_nothing_under_reef_imports_a_recipe_package() -> None:
    """Recipes plug into the framework (by reference), never the other way round."""
    offending = [f"{path.relative_to(ROOT.parent)}:{node.lineno}"
                 for path in sorted(ROOT.rglob("*.py"))
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.ImportFrom | ast.Import)
                 and any((getattr(node, "module", None) or alias.name).split(".")[0] == "recipes"
                         for alias in node.names)]
    assert offending == []


def test_release_and_engine_import_without_the_gateway() -> None:
    code = ("import sys, reef.serving.publisher, reef.cli.releases, reef.engine.supervisor, reef.learn.learner; "
            "print(sorted(m for m in sys.modules if m.startswith('reef.gateway')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_experimental_recipe_warns_when_used() -> None:
    code = ("import warnings\nwarnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    from reef.recipe.loading import resolve\n    resolve('kto'); resolve('rft')\n"
            "print([type(w.message).__name__ for w in seen])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['ExperimentalRecipeWarning']"


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in tests/helpers/ and fixtures in conftest.py: a test file (or a script a
    test runs) never imports a `test_*` module or conftest, nor does a helper."""
    import re

    name = r"(?:test_\w+|conftest)\b"
    test_module = re.compile(rf"^\s*(?:from\s+(?:tests)?\.{name}|import\s+tests\.{name}"
                             rf"|from\s+(?:tests|\.)\s+import\s+.*\b{name})", re.M)
    tests = Path(__file__).resolve().parent
    offending = [f"{path.relative_to(tests)}:{text[:m.start()].count(chr(10)) + 1}"
                 for path in sorted([*tests.glob("test_*.py"), tests / "conftest.py", *tests.glob("helpers/*.py")])
                 for text in [path.read_text()] for m in test_module.finditer(text)]
    assert offending == []
