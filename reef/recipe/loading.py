"""Loading recipes: `recipes.<name>.recipe:<Class>` references, `module:Class` of a user's own module,
or a bare built-in name (`rft`). Finding one without importing it is `reef.core.references`'s job."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.core.references import importable, module_of

if TYPE_CHECKING:
    from reef.recipe.base import Recipe
    from reef.scenario import Scenario

def resolve(ref: str, extra: Iterable[Path] = ()) -> type[Recipe]:
    """`recipes.rft.recipe:RFT` -> the class; `rft` -> the one Recipe subclass in recipes.rft.recipe."""
    from reef.recipe.base import Recipe

    _, _, class_name = ref.partition(":")
    module_name = module_of(ref)
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
