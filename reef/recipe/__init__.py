"""The recipe contract: recipes (TRL trainers over snapshots of recorded traffic) and their configs,
snapshots and the experience spec they apply, the consumed ledger. What a recipe returns
(`Candidate`, with its `Lineage`) is exported here and defined by the registry that stores it.

    from reef.recipe import Snapshot, load_recipe
    recipe = load_recipe("recipes.rft.recipe:RFT", {"scenario": "sentiment", "max_steps": 20})
    snap = Snapshot.create("sentiment", "data", recipe.experience())
    candidate = recipe.run(snap)
"""

from typing import Any

_EXPORTS = {
    "Recipe": "reef.recipe.base", "load_recipe": "reef.recipe.loading", "resolve": "reef.recipe.loading",
    "EmptySnapshotError": "reef.recipe.snapshot", "Snapshot": "reef.recipe.snapshot",
    "ExperienceSpec": "reef.recipe.snapshot", "RecipeConfig": "reef.recipe.config",
    # What a recipe returns; the registry stores it, so it is defined there.
    "Candidate": "reef.registry.schema", "Lineage": "reef.registry.schema",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # Lazy: serve.yaml's recipe references are checked through reef.recipe.loading, which must not
    # pull in torch and transformers with this package.
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
