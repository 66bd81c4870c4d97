"""Learning from experience: recipes (TRL trainers over snapshots of recorded traffic), snapshots,
the consumed ledger, evaluation and the DVC stages.

    from reef.recipe import Snapshot, load_recipe
    recipe = load_recipe("recipes.rft.recipe:RFT", {"max_steps": 20})
    snap = Snapshot.create("demo-add", "data", recipe.experience())
    candidate = recipe.run(snap)
"""

from reef.recipe.base import Recipe
from reef.recipe.registry import load_recipe, resolve
from reef.recipe.snapshot import EmptySnapshotError, Snapshot
from reef.recipe.spec import Candidate, ExperienceSpec, Lineage, RecipeConfig

__all__ = ["Candidate", "EmptySnapshotError", "ExperienceSpec", "Lineage", "Recipe", "RecipeConfig", "Snapshot",
           "load_recipe", "resolve"]
