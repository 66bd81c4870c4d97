"""Framework code never knows the demo: only reef/demo/, tests/ and bench/ may import `reef.demo`.

Every .py file under reef/ (but reef/demo/), recipes/ and dashboard/ is parsed, and any import of
`reef.demo` (or `from reef import demo`), or a string naming it (`"reef.demo.task:score"`, which
import_ref or importlib would import), fails the test. The notebooks are walkthroughs of the
bundled demo, like bench/, so they are not scanned.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.model_free

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("reef", "recipes", "dashboard")
DEMO = REPO / "reef" / "demo"
_DEMO_REF = re.compile(r"^reef\.demo(\.|:|$)")

# Files allowed to import the demo while it is being moved out of them; the test fails on an entry
# that no longer imports the demo, so this list can only shrink (it is empty now).
ALLOWED_FOR_NOW: set[str] = set()


def demo_imports(path: Path) -> list[str]:
    """`line: what` for each import of reef.demo, or string naming it, in one source file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value.strip()]
        found += [f"{node.lineno}: {name}" for name in names if _DEMO_REF.match(name)]
    return found


def framework_files() -> list[Path]:
    files = [p for folder in SCANNED for p in sorted((REPO / folder).rglob("*.py"))]
    return [p for p in files if DEMO not in p.parents]


def test_framework_never_imports_the_demo() -> None:
    files = framework_files()
    assert len(files) > 50, "the scan found too few files: wrong repository root?"
    offenders = {}
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        if (hits := demo_imports(path)) and rel not in ALLOWED_FOR_NOW:
            offenders[rel] = hits
    assert not offenders, f"framework modules import reef.demo (move the code to reef/demo/): {offenders}"


def test_allow_list_only_shrinks() -> None:
    stale = [rel for rel in ALLOWED_FOR_NOW if not (REPO / rel).is_file() or not demo_imports(REPO / rel)]
    assert not stale, f"no longer import reef.demo; remove them from ALLOWED_FOR_NOW: {stale}"


def test_the_scan_sees_each_kind_of_import(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import reef.demo.task\nfrom reef.demo import task\nfrom reef import demo\n"
                   "X = 'reef.demo.task:score'\nimport reef.demography\nY = 'reef.democracy'\n")
    assert demo_imports(src) == ["1: reef.demo.task", "2: reef.demo", "2: reef.demo.task", "3: reef.demo",
                                 "4: reef.demo.task:score"]


_TEST_MODEL_REF = re.compile(r"^tests(\.|:|$)")


def test_nothing_shipped_uses_the_tests_model() -> None:
    """The 1M model, its corpus and the scenarios it was taught live with the tests (tests/helpers/tiny):
    no module of reef/, recipes/, dashboard/ or examples/, and no notebook in notebooks/, imports from
    tests/ or names a module there."""
    offenders = {}
    for folder in (*SCANNED, "examples"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            hits = []
            for node in ast.walk(tree):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    names = [node.value.strip()]
                hits += [f"{node.lineno}: {name}" for name in names if _TEST_MODEL_REF.match(name)]
            if hits:
                offenders[path.relative_to(REPO).as_posix()] = hits
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        if "tests.helpers" in path.read_text() or "tests/helpers" in path.read_text():
            offenders[path.relative_to(REPO).as_posix()] = ["names tests/helpers"]
    assert not offenders, f"shipped code uses the tests' model or scenarios: {offenders}"
