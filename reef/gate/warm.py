"""The next gate's head arm, sampled ahead: while the learner waits for experience it has the head's
replies to the scenario's eval suite sampled through the engine and kept (reef.gate.head_replies),
so the round's gate samples only the candidate's arm. The tasks go in the order the gate's looks
take them (reef.gate.looks), so a warm-up cut short by a round that became due has sampled what the
gate's first look needs first; what it kept stays kept.

It samples what a gate of a weights candidate would send the head arm: the head's weights under the
name the engine serves them by, the head's harness applied where the gateway applies it. Like the
gate's, its requests yield to users (learner.share). Nothing is warmed where the gate would not
sample on the engine (the engine holds other full weights than the scenario's base).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from reef.config import GateSettings
from reef.gate.arms import engine_holds_base, head_weights, served_harness
from reef.gate.evaluate import schedule
from reef.gate.head_replies import HeadReplies, head_keys
from reef.gate.looks import part
from reef.gate.sample import sample_head
from reef.gate.scoring import declared_scenario, suite_for
from reef.registry.artifacts import ArtifactStore
from reef.registry.state import open_chain
from reef.sampling.engine import EngineEndpoint
from reef.scenario import ScenarioError


class Warmed(BaseModel):
    """What a warm-up did: for which head, how many of the suite's tasks were kept before it, how
    many it sampled, how many faulted (sampled again next time), and why it did nothing, if so."""

    head_release_id: str | None = None
    tasks: int = 0
    kept_before: int = 0
    sampled: int = 0
    faulted: int = 0
    skipped: str | None = Field(default=None, description="why nothing was sampled")

    @property
    def complete(self) -> bool:
        """Every task's head replies are kept now (or there is nothing to warm)."""
        return self.skipped is not None or self.kept_before + self.sampled == self.tasks


def warm_head(data_dir: Path | str, scenario: str, config: GateSettings, engine: EngineEndpoint, *,
              progress: bool = False) -> Warmed:
    """Sample and keep the head's replies to every eval task not kept yet, look by look."""
    chain = open_chain(data_dir, scenario)
    head = chain.head()
    if head is None:
        return Warmed(skipped="no release yet")
    r0 = chain.releases()[0]
    if not engine_holds_base(data_dir, r0.content_id):
        return Warmed(head_release_id=head.release_id, skipped="the engine holds other full weights: the gate "
                      "samples with transformers")
    try:
        suite = suite_for(scenario, engine.base_url, engine.model)
    except ScenarioError as exc:  # no eval suite: no gate to warm (the round says why it cannot gate)
        return Warmed(head_release_id=head.release_id, skipped=str(exc))
    store = ArtifactStore.for_data_dir(data_dir)
    weights = head_weights(store, head, r0, engine)
    harness = served_harness(store, head, declared_scenario(scenario).harness.inject)
    kept = HeadReplies(data_dir, scenario)
    samples, _, looks = schedule(suite, config)
    done = Warmed(head_release_id=head.release_id, tasks=len(suite.tasks))
    start = 0
    for indices in looks:
        piece = part(suite, indices, start)
        start += len(indices)
        tasks = harness.tasks(piece)["head"] if harness is not None else list(piece.tasks)
        keys = head_keys(weights.content, tasks, piece, samples) or []
        have = sum(kept.get(key) is not None for key in keys)
        done.kept_before += have
        if have == len(keys):
            continue
        run = sample_head(weights, piece, samples, config, engine, kept, data_dir=data_dir, progress=progress,
                          harnesses=harness)
        done.sampled += len(keys) - have - len(run.faults)
        done.faulted += len(run.faults)
    return done
