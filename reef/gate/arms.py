"""The gate's two arms, resolved: which weights answer as the candidate and which as the head, and
with which harness. Sampling them is reef.gate.sample's; judging them is reef.gate.evaluate's.

A registered candidate is found in the registry: a LoRA must run on the scenario's base weights, a
full-weight candidate must share the base's tokenizer and chat template, and the head is the
scenario's current release (its first one, r0, made from the candidate's base when it has none).
On an engine, the head answers under the name the engine already serves it by (the base model, a
serving release's adapter). Outside any release chain (the DVC evaluate stage, `reef recipe run`),
the arms are two folders: a recipe's candidate folder and a model folder.

A harness candidate (prompts, rules, skills; reef.recipe.harness_recipe) runs on the head's weights
in both arms: each eval prompt is sent with the candidate's harness in one arm and with the head's
harness (or none) in the other, applied the way the scenario serves it (`harness.inject`; `off`,
where clients apply the harness themselves, is gated as `system_prepend`), with the same per-task
seeds, so the pairs differ only by the harness. A weights candidate is released with the head's
harness (a weights release keeps it), so where the gateway applies it both arms' prompts carry it:
the candidate is judged on the prompts it will serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reef.core.paths import CANDIDATE_FILE
from reef.gate.scoring import declared_scenario
from reef.registry.artifacts import HARNESS_METRICS_FILE, ArtifactStore, tree_files
from reef.registry.base_model import base_of, ensure_scenario, model_folders
from reef.registry.candidates import CandidateView
from reef.registry.harness import Harness, inject, load_harness
from reef.registry.schema import Candidate, Release, adapter_name
from reef.registry.state import ReleaseState
from reef.sampling.engine import EngineEndpoint
from reef.scenario import EvalSuite, Task

ARMS = ("candidate", "head")


@dataclass(frozen=True)
class Weights:
    """One arm of the gate: a full model folder, a LoRA adapter on it, and the name the engine
    already serves it under (the base model, a serving release's adapter), if any; `content`: its
    artifact content id, where it is a release's (what its kept replies are keyed by)."""

    model: Path
    adapter: Path | None = None
    served: str | None = None
    content: str | None = None

    @classmethod
    def of_folder(cls, path: Path | str) -> Weights:
        """A model folder, or a recipe's candidate folder (a LoRA runs on the base it names)."""
        model, adapter = Candidate.weights_of(path)
        return cls(model, adapter)


@dataclass(frozen=True)
class HarnessArms:
    """The harness each arm's eval prompts are sent with (None: as the suite has them), and how."""

    candidate: Harness | None
    head: Harness | None
    inject: str = "system_prepend"

    @property
    def compared(self) -> bool:
        """Whether the arms differ by their harness (a harness candidate); else both carry the head's."""
        return self.candidate != self.head

    def tasks(self, suite: EvalSuite) -> dict[str, list[Task]]:
        mode = "system_prepend" if self.inject == "off" else self.inject
        return {arm: [t if h is None else {**t, "messages": inject(list(t["messages"]), h, mode)} for t in suite.tasks]
                for arm, h in (("candidate", self.candidate), ("head", self.head))}


@dataclass(frozen=True)
class Arms:
    """What answers as the candidate and as the head; `harnesses`: the harness each arm's prompts
    carry (a harness candidate: both arms on the head's weights)."""

    candidate: Weights
    head: Weights
    harnesses: HarnessArms | None = None


# --- two folders -----------------------------------------------------------------------------------


def folder_arms(candidate: Path | str, baseline: Path | str, scenario: str) -> Arms:
    """A recipe's candidate folder vs. a model folder; a harness candidate folder runs on
    `baseline`'s weights against no harness."""
    folder = Path(candidate)
    if _folder_kind(folder) == "harness":
        files = {p: (folder / p).read_text(encoding="utf-8") for p in tree_files(folder) if p not in _NOT_HARNESS}
        harnesses = HarnessArms(Harness("", files), None, declared_scenario(scenario).harness.inject)
        weights = Weights.of_folder(baseline)
        return Arms(weights, weights, harnesses)
    return Arms(Weights.of_folder(candidate), Weights.of_folder(baseline))


_NOT_HARNESS = (CANDIDATE_FILE, HARNESS_METRICS_FILE)  # a candidate folder's metadata and `reef recipe run`'s metrics


def _folder_kind(folder: Path) -> str | None:
    candidate = Candidate.read_if_any(folder)
    return candidate.kind if candidate is not None else None


# --- a registered candidate against its scenario's head -------------------------------------------


def first_head(data_dir: Path | str, view: CandidateView, base_model: str | None, store: ArtifactStore) -> Release:
    """The release r0 of a scenario with no chain yet, made from `base_model` (default: the base
    the candidate was trained on)."""
    base = base_model or (view.lineage.base_model if view.lineage else None)
    if base is None:
        raise ValueError(f"scenario {view.scenario} has no release yet and no base model is known")
    chain, _ = ensure_scenario(data_dir, view.scenario, base, store)
    head = chain.head()
    assert head is not None
    return head


def engine_holds_base(data_dir: Path | str, base_content: str) -> bool:
    """Whether the engine runs the base weights: full weights are shared by every scenario, so a
    full-weight head anywhere means the engine may hold other weights than the base."""
    state = ReleaseState(data_dir)
    for scenario in state.scenarios():
        head = state.chain(scenario).head()
        if head is not None and head.kind == "full" and head.content_id != base_content:
            return False
    return True


def registered_arms(store: ArtifactStore, view: CandidateView, head: Release, r0: Release,
                    engine: EngineEndpoint | None) -> Arms:
    """The candidate's weights (or harness) and the head's; raises when the candidate cannot serve
    on the scenario's base."""
    weights = head_weights(store, head, r0, engine)
    if view.kind == "harness":  # same weights in both arms; the prompts carry each arm's harness
        return Arms(weights, weights, HarnessArms(
            load_harness(store, view.candidate_id),
            load_harness(store, head.harness_id) if head.harness_id else None,
            declared_scenario(view.scenario).harness.inject))
    _check_same_base(store, view.candidate_id, r0)
    served = served_harness(store, head, declared_scenario(view.scenario).harness.inject)
    return Arms(Weights(*model_folders(store, view.candidate_id)), weights, served)


def served_harness(store: ArtifactStore, head: Release, inject: str) -> HarnessArms | None:
    """The head's harness in both arms, for a weights candidate, where the gateway applies it
    (`inject` not `off`: a harness clients fetch themselves is theirs to apply, if at all); None: the
    prompts as the suite has them."""
    if head.harness_id is None or inject == "off":
        return None
    harness = load_harness(store, head.harness_id)
    return HarnessArms(harness, harness, inject)


def _check_same_base(store: ArtifactStore, candidate: str, r0: Release) -> None:
    """The candidate must serve on the scenario's base: same weights for a LoRA, same tokenizer and
    chat template for full weights."""
    manifest, base = store.get(candidate), store.get(r0.content_id)
    if manifest.kind == "lora":
        if base_of(store, manifest).content_id != r0.content_id:
            raise ValueError(f"the LoRA runs on weights {manifest.base_model_sha256}, not this scenario's base")
    elif (manifest.tokenizer_sha256, manifest.chat_template_sha256) != (base.tokenizer_sha256,
                                                                          base.chat_template_sha256):
        raise ValueError("the candidate's tokenizer or chat template differs from the base model's")


def head_weights(store: ArtifactStore, head: Release, r0: Release, engine: EngineEndpoint | None) -> Weights:
    """The head's weights as the gate samples them: on `engine` under the name it serves them by."""
    model, adapter = model_folders(store, head.content_id)
    if engine is None:
        return Weights(model, adapter, content=head.content_id)
    if head.content_id == r0.content_id:
        return Weights(model, None, engine.model, head.content_id)
    return Weights(model, adapter, adapter_name(head.content_id) if adapter is not None else None, head.content_id)
