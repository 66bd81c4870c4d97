"""The gate's two views of the per-task differences, and the verdict that needs both: a bootstrap
interval of their mean (is the improvement above `min_delta`, by how much), and a paired exact sign
test (does the candidate win more tasks than chance allows: it needs no assumption about how the
differences are distributed, only that a pair is as likely to go either way under no effect).

The interval alone is fooled by a few large wins among ties (5 wins of 80 tasks and no loss put a
95 % interval above 0, yet 5 of 5 is p = 0.0625 for the sign test); the sign test alone by many
tiny wins worth less than `min_delta`. A candidate is selected only when both agree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import comb

import numpy as np

from reef.config import GateSettings


def bootstrap_ci(diffs: Sequence[float], confidence: float, resamples: int, seed: int) -> tuple[float, float]:
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


@dataclass(frozen=True)
class Verdict:
    """Both statistics of a list of per-task differences (candidate minus head) and what they decide."""

    delta: float
    low: float
    high: float
    wins: int
    losses: int
    ties: int
    sign_p: float
    interval_clears: bool  # the whole interval lies above min_delta
    sign_agrees: bool  # more wins than losses, p below 1 - confidence (True when the sign test is off)

    @property
    def selected(self) -> bool:
        return self.interval_clears and self.sign_agrees


def judge(diffs: Sequence[float], config: GateSettings) -> Verdict:
    """The verdict on `diffs` (at least one): selected when the bootstrap interval (`config.confidence`,
    `bootstrap` resamples seeded with `seed`) lies above `min_delta` and, unless `sign_test` is off,
    the two-sided exact sign test over the tasks that differ is below `1 - confidence` with more
    candidate wins than head wins."""
    if not diffs:
        raise ValueError("no paired task to judge")
    low, high = bootstrap_ci(diffs, config.confidence, config.bootstrap, config.seed)
    wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    sign_p = sign_test(wins, losses)
    agrees = not config.sign_test or (wins > losses and sign_p < 1.0 - config.confidence)
    return Verdict(delta=sum(diffs) / len(diffs), low=low, high=high, wins=wins, losses=losses,
                   ties=len(diffs) - wins - losses, sign_p=sign_p, interval_clears=low > config.min_delta,
                   sign_agrees=agrees)
