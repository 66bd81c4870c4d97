"""Notebooks as committed: no outputs and no execution counts, one "parameters" cell for papermill,
the project kernel, and notebook 03 carrying notebook 02's recipe cell verbatim. `make test` also
executes them (pytest --nbmake); this only checks the files."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.model_free

# notebooks/: the walkthroughs on the default model; tests/notebooks/: those still on the tests' tiny model.
NOTEBOOKS = sorted([*(Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"),
                    *(Path(__file__).resolve().parent / "notebooks").glob("*.ipynb")])


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "notebooks/*.ipynb not found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("outputs"):
            dirty.append(f"cell {i}: {len(cell.outputs)} output(s)")
        if cell.get("execution_count") is not None:
            dirty.append(f"cell {i}: execution_count {cell.execution_count}")
    assert not dirty, (
        f"{path.name} is committed with outputs ({'; '.join(dirty)}); clear them: "
        f"`.venv/bin/jupyter nbconvert --clear-output --inplace {path.relative_to(path.parents[1])}`"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_has_one_parameters_cell_and_the_project_kernel(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1 and tagged[0].cell_type == "code", f"{path.name}: one code cell tagged 'parameters'"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernel must be python3"


def test_notebook_03_releases_the_recipe_written_in_02() -> None:
    """Notebook 03 carries notebook 02's recipe cell (tagged "recipe") verbatim, so what it releases is
    what 02 develops; edit both together."""
    sources = {}
    for path in NOTEBOOKS:
        cells = [c.source for c in nbformat.read(path, as_version=4).cells
                 if "recipe" in c.get("metadata", {}).get("tags", [])]
        if cells:
            sources[path.name] = cells
    assert set(sources) >= {"02_develop_a_recipe.ipynb", "03_compare_and_release.ipynb"}, sorted(sources)
    assert sources["02_develop_a_recipe.ipynb"] == sources["03_compare_and_release.ipynb"]
