"""Recipes whose learning figures are not yet reliable (no bench target they are held to): their
interface and defaults may change. Importing any of them warns once, as `trl.experimental` does.

    kto        thumbs up/down reports through TRL's KTOTrainer
    ttt        test-time training on one problem
    self_play  a proposer picks problems to practise, a solver learns them
"""

import warnings


class ExperimentalRecipeWarning(UserWarning):
    """A recipe from `recipes.experimental` is in use."""


warnings.warn("recipes.experimental: this recipe is experimental; its interface and defaults may change",
              ExperimentalRecipeWarning, stacklevel=1)
