"""Finding what a config names by reference, without importing it: a bare built-in recipe name
(`rft`: a folder `recipes/<name>/` or `recipes/experimental/<name>/` holding `recipe.py`) or a
`module:Class` reference. Cheap (no torch), so serve.yaml's references are checked before anything
heavy loads; `reef.recipe.loading` imports them.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path

# The project root holds `recipes/`; it is not an installed package, so make it importable from
# any working directory (the `reef` console script does not put the cwd on sys.path).
_ROOTS = (Path.cwd(), Path(__file__).resolve().parents[2])


def importable(extra: Iterable[Path] = ()) -> None:
    """Put the recipe roots (and `extra` folders, e.g. the one holding serve.yaml) on sys.path."""
    for root in _ROOTS:
        if (root / "recipes").is_dir() and str(root) not in sys.path:
            sys.path.append(str(root))
    for folder in extra:
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


# Where a bare name is looked up, stable recipes first; `recipes/experimental/` holds the recipes
# whose figures are not yet reliable (importing one warns).
_RECIPE_FOLDERS = ("recipes", "recipes/experimental")


def _builtin_modules() -> dict[str, str]:
    found: dict[str, str] = {}
    for folder in reversed(_RECIPE_FOLDERS):
        for root in _ROOTS:
            for path in (root / folder).glob("*/recipe.py"):
                found[path.parent.name] = f"{folder.replace('/', '.')}.{path.parent.name}.recipe"
    return found


def builtin_recipes() -> list[str]:
    """The bundled recipes' short names (folders `recipes/<name>/recipe.py` and
    `recipes/experimental/<name>/recipe.py`)."""
    return sorted(_builtin_modules())


def module_of(ref: str) -> str:
    module_name, _, class_name = ref.partition(":")
    if "." not in module_name and not class_name:
        return _builtin_modules().get(module_name, f"recipes.{module_name}.recipe")
    return module_name


def reference_problem(ref: str, extra: Iterable[Path] = ()) -> str | None:
    """Why `ref` cannot name a recipe, without importing it (None when it can): a bare name must be
    a built-in recipe, a module reference must be findable."""
    module_name, _, class_name = ref.partition(":")
    if not module_name:
        return f"{ref!r} is not a recipe reference (a built-in name or module:Class)"
    if "." not in module_name and not class_name:
        if module_name in builtin_recipes():
            return None
        return f"{ref!r} is not a built-in recipe {builtin_recipes()} nor module:Class"
    importable(extra)
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        found = None
    return None if found is not None else f"{ref!r}: module {module_name!r} not found"
