"""Finding recipes: `recipes.<name>.recipe:<Class>` references, or a bare name (`rft`)."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

import reef
from reef.recipe.base import Recipe
from reef.scenario import Scenario

# The project root holds `recipes/`; it is not an installed package, so make it importable from
# any working directory (the `reef` console script does not put the cwd on sys.path).
_ROOTS = (Path.cwd(), Path(reef.__file__).resolve().parents[1])


def _importable() -> None:
    for root in _ROOTS:
        if (root / "recipes").is_dir() and str(root) not in sys.path:
            sys.path.append(str(root))


def resolve(ref: str) -> type[Recipe]:
    """`recipes.rft.recipe:RFT` -> the class; `rft` -> the one Recipe subclass in recipes.rft.recipe."""
    module_name, _, class_name = ref.partition(":")
    if "." not in module_name and not class_name:
        module_name = f"recipes.{module_name}.recipe"
    _importable()
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


def load_recipe(ref: str, params: dict[str, Any] | None = None, declared: Scenario | None = None) -> Recipe:
    """Instantiate a recipe from its reference and params.yaml-style values (unknown keys fail);
    `declared`: the scenario it learns for (default: looked up by the `scenario` param's name)."""
    return resolve(ref)(declared=declared, **(params or {}))
