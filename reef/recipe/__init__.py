"""Learning from experience: recipes (TRL trainers over snapshots of recorded traffic), snapshots,
the consumed ledger, evaluation and the DVC stages.

    from reef.recipe import Snapshot, load_recipe
    recipe = load_recipe("recipes.rft.recipe:RFT", {"max_steps": 20})
    snap = Snapshot.create("demo-add", "data", recipe.experience())
    candidate = recipe.run(snap)
"""

from typing import Any

_EXPORTS = {
    "Recipe": "reef.recipe.base", "load_recipe": "reef.recipe.loading", "resolve": "reef.recipe.loading",
    "EmptySnapshotError": "reef.recipe.snapshot", "Snapshot": "reef.recipe.snapshot",
    "Candidate": "reef.recipe.spec", "ExperienceSpec": "reef.recipe.spec", "Lineage": "reef.recipe.spec",
    "RecipeConfig": "reef.recipe.spec",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # Lazy: serve.yaml's recipe references are checked through reef.recipe.loading, which must not
    # pull in torch and transformers with this package.
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
