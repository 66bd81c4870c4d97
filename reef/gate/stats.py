"""The gate's two views of the per-task differences: a bootstrap interval of their mean (what
selects), and a paired exact sign test (reported beside it: it needs no assumption about how the
differences are distributed, only that a pair is as likely to go either way under no effect)."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np


def bootstrap_ci(diffs: list[float], confidence: float, resamples: int, seed: int) -> tuple[float, float]:
    """Percentile interval of the mean of `diffs`, resampling its items with replacement."""
    values = np.asarray(diffs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    tail = (1.0 - confidence) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact binomial p-value of `wins` among `wins + losses` pairs at p = 1/2 (ties are
    left out by the caller: they say nothing about which arm is better); 1.0 when no pair differs.

    With p = 1/2 the distribution is symmetric, so the two-sided p-value is twice the smaller tail;
    it is computed in exact integers (scipy is not a dependency, and a float sum of binomial terms
    loses the small tails that matter here)."""
    if wins < 0 or losses < 0:
        raise ValueError(f"counts must be non-negative, got {wins} wins and {losses} losses")
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(wins, losses) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))
