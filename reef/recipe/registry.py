"""Finding recipes: `recipes.<name>.recipe:<Class>` references, `module:Class` of a user's own module,
or a bare built-in name (`rft`). Importing this module is cheap (no torch): serve.yaml's references
are checked with it before anything heavy loads."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import reef

if TYPE_CHECKING:
    from reef.recipe.base import Recipe
    from reef.scenario import Scenario

# The project root holds `recipes/`; it is not an installed package, so make it importable from
# any working directory (the `reef` console script does not put the cwd on sys.path).
_ROOTS = (Path.cwd(), Path(reef.__file__).resolve().parents[1])


def importable(extra: Iterable[Path] = ()) -> None:
    """Put the recipe roots (and `extra` folders, e.g. the one holding serve.yaml) on sys.path."""
    for root in _ROOTS:
        if (root / "recipes").is_dir() and str(root) not in sys.path:
            sys.path.append(str(root))
    for folder in extra:
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


def builtin_recipes() -> list[str]:
    """The bundled recipes' short names (folders `recipes/<name>/recipe.py`)."""
    names = {p.parent.name for root in _ROOTS for p in (root / "recipes").glob("*/recipe.py")}
    return sorted(names)


def _module_of(ref: str) -> str:
    module_name, _, class_name = ref.partition(":")
    if "." not in module_name and not class_name:
        return f"recipes.{module_name}.recipe"
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


def resolve(ref: str, extra: Iterable[Path] = ()) -> type[Recipe]:
    """`recipes.rft.recipe:RFT` -> the class; `rft` -> the one Recipe subclass in recipes.rft.recipe."""
    from reef.recipe.base import Recipe

    _, _, class_name = ref.partition(":")
    module_name = _module_of(ref)
    importable(extra)
    module = importlib.import_module(module_name)
    if class_name:
        cls = getattr(module, class_name, None)
    else:
        found = [c for _, c in inspect.getmembers(module, inspect.isclass)
                 if issubclass(c, Recipe) and c is not Recipe and c.__module__ == module.__name__]
        if len(found) != 1:
            raise LookupError(f"{module_name} defines {len(found)} Recipe classes; name one as {module_name}:<Class>")
        cls = found[0]
    if not (inspect.isclass(cls) and issubclass(cls, Recipe)):
        raise LookupError(f"{ref} is not a Recipe class")
    return cls


def load_recipe(ref: str, params: dict[str, Any] | None = None, declared: Scenario | None = None,
                extra: Iterable[Path] = ()) -> Recipe:
    """Instantiate a recipe from its reference and params.yaml-style values (unknown keys fail);
    `declared`: the scenario it learns for (default: looked up by the `scenario` param's name);
    `extra`: folders a user's recipe module is imported from (the one holding serve.yaml)."""
    return resolve(ref, extra)(declared=declared, **(params or {}))
