"""The gate's settings: one model behind serve.yaml's `release.gate`, params.yaml's `gate:` and the
code that gates (reef.gate takes a `GateSettings`). Replies are sampled as the scenario's eval declares.

The keys they replaced (serve.yaml's flat `release.gate_samples`, ..., params.yaml's gate fields
under `evaluate:`) still work for one release: `move_keys` moves them into the model, with a
DeprecationWarning (and a log line) naming the new key.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("reef.config")


class GateSettings(BaseModel):
    """How the gate compares a candidate with the head: replies per task, the two statistics a
    selection needs (the bootstrap interval above `min_delta`, the exact sign test below
    1 - `confidence`), and how it treats the engine's faults and replies the reward cannot score."""

    model_config = ConfigDict(extra="forbid")  # an unknown key is an error naming it, as everywhere in the config

    samples: int | None = Field(default=None, ge=1, description="replies per task and arm; unset: the scenario's "
                                "eval.samples (1 when its eval is greedy, temperature 0)")
    seed: int = Field(default=0, description="of the bootstrap resampling (the replies' seeds are eval.seed)")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="of the bootstrap interval of the difference")
    min_delta: float = Field(default=0.0, description="the interval's lower bound must lie above this to select")
    sign_test: bool = Field(default=True, description="selecting also needs the two-sided exact sign test over "
                            "the tasks that differ below 1 - confidence, with more candidate wins than head wins "
                            "(it needs 6 such tasks at 95 %: 5 of 5 is p = 0.0625); false: the interval alone "
                            "decides, for suites too small for the test (the sign test is still reported)")
    bootstrap: int = Field(default=2000, ge=1, description="bootstrap resamples")
    probe_tokens: int = Field(default=8, ge=1, description="greedy tokens of the canary probe")
    concurrency: int = Field(default=64, ge=1, description="engine requests in flight")
    fault_retries: int = Field(default=2, ge=0, description="retries of an engine request after an infrastructure "
                               "fault (timeout, lost connection, 5xx); a task still failing is void, never scored 0")
    fault_backoff_s: float = Field(default=1.0, ge=0, description="before the first retry; doubled for each next")
    min_valid_pairs: int = Field(default=16, ge=1, description="tasks with a scored reply in both arms (at most the "
                                 "suite's size): a task the engine faulted on, or whose replies the reward could not "
                                 "score in an arm, is not one; fewer: the decision is void, not reject")
    request_timeout_s: float = Field(default=600.0, gt=0, description="past it, an engine request has faulted")
    looks: int = Field(default=3, ge=1, description="the gate samples the suite in this many parts of a seeded "
                       "random order and judges after each; before the last, a candidate is selected early when "
                       "both statistics pass at early_confidence (reef.gate.looks); 1: one look at every task")
    early_confidence: float = Field(default=0.999, gt=0, lt=1, description="what an early selection needs, in "
                                    "place of confidence (Haybittle-Peto: strict, so the last look keeps confidence)")
    reuse_head_replies: bool = Field(default=True, description="on the engine, keep the head's replies to each task "
                                     "between gates against the same head, and let the learner sample them while it "
                                     "waits for experience: a gate then samples the candidate's arm alone "
                                     "(reef.gate.head_replies); gates against one head then share the head's sample")


def move_keys(source: dict[str, Any], target: Any, moves: Mapping[str, str], old: str, new: str) -> dict[str, Any]:
    """`target` (the new section's keys) with each deprecated key of `source` that `moves` names
    (old name -> GateSettings field) popped from `source` and moved in, warning that `<old><name>` is
    now `<new><field>`. Both given is an error: the two would disagree."""
    moved = target.model_dump(exclude_unset=True) if isinstance(target, BaseModel) else dict(target or {})
    for name, field in moves.items():
        if name not in source:
            continue
        if field in moved:
            raise ValueError(f"{old}{name} and {new}{field} are the same setting: keep {new}{field}")
        message = f"{old}{name} is deprecated: write {new}{field} (the old key goes in the next release)"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        log.warning(message)
        moved[field] = source.pop(name)
    return moved
