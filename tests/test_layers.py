"""Dependencies point one way: nothing below the gateway imports it (no cycle through routing types)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import reef

ROOT = Path(reef.__file__).parent
BELOW_GATEWAY = ("release", "engine", "recipe", "experience", "learn")


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_no_package_below_the_gateway_imports_it() -> None:
    offending = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {name}"
        for package in BELOW_GATEWAY
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, name in _imports(path)
        if name == "reef.gateway" or name.startswith("reef.gateway.")
    ]
    assert offending == []


def test_the_checker_sees_lazy_imports(tmp_path: Path) -> None:
    """An import inside a function counts too (the scan must be able to fail)."""
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    from reef.gateway.routing import Routes\n    import reef.gateway\n")
    assert [name for _, name in _imports(sample)] == ["reef.gateway.routing", "reef.gateway.routing.Routes",
                                                      "reef.gateway"]


def test_release_and_engine_import_without_the_gateway() -> None:
    code = ("import sys, reef.release.publisher, reef.release.cli, reef.engine.supervisor, reef.learn.learner; "
            "print(sorted(m for m in sys.modules if m.startswith('reef.gateway')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
