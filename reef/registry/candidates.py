"""The candidate register: which candidates a scenario has, what the gate said, who rejected or
released them.

    <data_dir>/releases/<scenario>/candidates.jsonl   one CandidateEvent per line, append-only
    <data_dir>/releases/<scenario>/gate/<id>.json     the gate's per-prompt outputs (for people)

With serve.yaml's `state.url` (REEF_STATE__URL) the events are rows in PostgreSQL instead
(reef.core.eventlog_pg), shared by every gateway and learner; the gate's per-prompt outputs stay
files under the data dir (content for people to read, not state anything decides on).

A candidate's state is the fold of its events through `TRANSITIONS`, so nothing is ever edited in
place and the log is its own audit log. Every append is checked against the fold of the log as it
is under the log's lock (a flock, or one PostgreSQL transaction), so of two writers racing on one
candidate (a person's rejection and a gate's select, on two machines) the second is judged after
the first: once released or rejected by a person a candidate stays so.

Registering imports the candidate folder into the content-addressed artifact
store; the candidate id is the artifact's content id, so registering the same weights (or harness
tree) twice is one candidate.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from reef.core.clock import utcnow
from reef.core.durable import replace_atomically
from reef.core.eventlog import EventLog, open_event_log, scenarios_with_log
from reef.core.paths import DataDir
from reef.core.statemachine import IllegalTransitionError, LogEvent, Transitions
from reef.registry.artifacts import ArtifactStore
from reef.registry.schema import ArtifactKind, Candidate, Lineage, validate_scenario

log = logging.getLogger("reef.registry")

CANDIDATES_FILE = "candidates.jsonl"
LOCK_FILE = "CANDIDATES.LOCK"
MACHINE = "candidate"  # the log's name in PostgreSQL (reef_events.machine)
GATE_DIR = "gate"
MIN_PREFIX = 8

Status = Literal["registered", "selected", "rejected", "void", "released"]
EventKind = Literal["registered", "evaluated", "rejected", "released"]

# The states a candidate goes through. `gate_rejected` shows as status "rejected" but may be gated
# again (a fixed eval suite, a gate error); a person's rejection and a release are final.
# `gate_void` (status "void") is a gate that could not judge (too few pairs the engine answered,
# reef.gate.faults): no judgement either way, so not releasable (its result proves nothing) and
# gated again as is.
_GATED = {"selected", "gate_rejected", "gate_void"}
TRANSITIONS = Transitions("candidate", {
    None: {"registered"},
    "registered": {*_GATED, "rejected"},
    "selected": {*_GATED, "rejected", "released"},
    "gate_rejected": {*_GATED, "rejected"},
    "gate_void": {*_GATED, "rejected"},
    "rejected": set(),
    "released": set(),
})
_STATUS: dict[str, Status] = {"registered": "registered", "selected": "selected", "gate_rejected": "rejected",
                              "gate_void": "void", "rejected": "rejected", "released": "released"}


class CandidateError(RuntimeError):
    pass


class CandidateStateError(CandidateError, IllegalTransitionError):
    """An event the candidate's state does not allow (e.g. a gate result after its release)."""


class CandidateNotFoundError(CandidateError, LookupError):
    pass


class PromptOutcome(BaseModel):
    messages: list[dict[str, Any]]
    candidate_replies: list[str]
    head_replies: list[str]
    candidate_score: float | None  # None: the reward scored none of this arm's replies
    head_score: float | None
    unscored: int = 0  # replies (both arms) the reward could not score
    fault: str | None = None  # set: the engine faulted on this task past its retries; void, in neither arm


class Probe(BaseModel):
    """A greedy reply the candidate must reproduce once it serves: how a swap proves what serves."""

    messages: list[dict[str, Any]]
    max_tokens: int
    text: str


class GateResult(BaseModel):
    decision: Literal["select", "reject", "void"] = Field(
        description="select: the bootstrap interval and the sign test both agree; void: too few pairs scored in both "
        "arms to judge (infrastructure faults, replies the reward could not score); no judgement")
    reason: str
    head_release_id: str | None = None
    candidate_success: float | None = None
    head_success: float | None = None
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    confidence: float | None = None
    prompts: int = 0
    samples_per_prompt: int = 0
    wins: int = 0
    losses: int = 0
    ties: int = 0
    unscored: int = Field(default=0, description="replies the reward could not score: left out, never counted as 0")
    void_pairs: int = Field(default=0, description="tasks left out of both arms: the engine faulted past the retries")
    fault_retries: int = Field(default=0, description="sample requests retried after an infrastructure fault")
    sign_p: float | None = Field(default=None, description="two-sided exact sign test over the pairs that differ; "
                                 "selecting needs it below 1 - confidence, with more wins than losses")
    backend: Literal["engine", "transformers"] | None = Field(default=None, description="what sampled the replies")
    probe: Probe | None = None
    evaluated_at: datetime = Field(default_factory=utcnow)
    seconds: float | None = None
    tasks_sampled: int | None = Field(default=None, description="eval tasks sampled: fewer than the suite's when "
                                      "the gate stopped early at a look (gate.looks)")
    stopped_early: bool = Field(default=False, description="selected at a look before the last, at "
                                "gate.early_confidence")
    head_replies_reused: int = Field(default=0, description="tasks whose head replies were kept from an earlier gate "
                                     "or the learner's warm-up against the same head (reef.gate.head_replies)")
    per_prompt: list[PromptOutcome] | None = None

    def summary(self) -> dict[str, Any]:
        """A release's `evaluation` field: the decision and its numbers, without per-prompt outputs."""
        return self.model_dump(mode="json", exclude={"per_prompt", "probe"})


class CandidateEvent(LogEvent):
    candidate_id: str
    event: EventKind
    by: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


def _next_state(event: CandidateEvent) -> str:
    if event.event == "evaluated":
        return {"select": "selected", "void": "gate_void"}.get(str(event.data.get("decision")), "gate_rejected")
    return event.event


class CandidateView(BaseModel):
    """A candidate as of its latest event: what the API and the dashboard show."""

    candidate_id: str
    scenario: str
    kind: ArtifactKind
    status: Status
    source: str | None = None
    source_id: str | None = None  # the recipe's own id (`<scenario>-<hash>`), for people
    created_at: datetime
    lineage: Lineage | None = None
    train_metrics: dict[str, Any] = Field(default_factory=dict)
    training_log: list[dict[str, Any]] = Field(default_factory=list, description="per-step training metrics")
    mutations: list[dict[str, Any]] = Field(default_factory=list,
                                            description="a harness candidate's changes to its parent harness")
    gate: GateResult | None = None
    rejected_by: str | None = None
    reject_reason: str | None = None
    release_id: str | None = None
    state: str = Field(default="registered", exclude=True)  # the TRANSITIONS state behind `status`


# Spelled outside the class, whose `list` method hides the builtin in its annotations.
Events = list[CandidateEvent]
Views = list[CandidateView]


class CandidateRegistry:
    """A scenario's candidates: in files under `data_dir`, or in PostgreSQL at `url` (None:
    REEF_STATE__URL, else files)."""

    def __init__(self, data_dir: Path | str, scenario: str, *, url: str | None = None, fsync: bool = True) -> None:
        self.data_dir = Path(data_dir)
        self.scenario = validate_scenario(scenario)
        self.dir = DataDir(self.data_dir).releases(scenario)
        self.path = self.dir / CANDIDATES_FILE
        self.fsync = fsync
        self.log: EventLog[CandidateEvent] = open_event_log(
            MACHINE, self.scenario, self.path, CandidateEvent, url=url, lock_path=self.dir / LOCK_FILE, fsync=fsync)

    @classmethod
    def scenarios(cls, data_dir: Path | str, url: str | None = None) -> list[str]:
        found = scenarios_with_log(MACHINE, url)
        if found is not None:
            return found
        root = DataDir(data_dir).releases()
        return sorted(p.parent.name for p in root.glob(f"*/{CANDIDATES_FILE}")) if root.is_dir() else []

    # --- reading ------------------------------------------------------------------------------

    def events(self) -> list[CandidateEvent]:
        return self.log.events()

    def list(self) -> list[CandidateView]:
        """Every candidate, newest first."""
        return sorted(self._fold(self.events()).values(), key=lambda v: v.created_at, reverse=True)

    def _fold(self, events: Events) -> dict[str, CandidateView]:
        """Each candidate as of its latest event that the table allows."""
        views: dict[str, CandidateView] = {}
        for ev in events:
            view = views.get(ev.candidate_id)
            state = _next_state(ev)
            if not TRANSITIONS.allowed(view.state if view else None, state):
                # Only a log written before transitions were checked can hold one: keep the earlier state.
                log.warning("%s: ignoring %s event of candidate %s in state %s", self.log.location, ev.event,
                            ev.candidate_id[:12], view.state if view else None)
                continue
            update: dict[str, Any] = {"state": state, "status": _STATUS[state]}
            if ev.event == "registered":
                views[ev.candidate_id] = CandidateView.model_validate(
                    {**ev.data, "candidate_id": ev.candidate_id, "scenario": self.scenario, **update})
                continue
            assert view is not None
            if ev.event == "evaluated":
                update["gate"] = GateResult.model_validate(ev.data)
            elif ev.event == "rejected":
                update.update(rejected_by=ev.by, reject_reason=ev.data.get("reason"))
            elif ev.event == "released":
                update["release_id"] = ev.data.get("release_id")
            views[ev.candidate_id] = view.model_copy(update=update)
        return views

    def get(self, candidate_id: str, *, details: bool = False) -> CandidateView:
        """By id or unique prefix (>= 8 characters); with `details`, the gate's per-prompt outputs."""
        view = self._match(self.list(), candidate_id)
        if details and view.gate is not None:
            path = self.dir / GATE_DIR / f"{view.candidate_id}.json"
            if path.is_file():
                outcomes = [PromptOutcome.model_validate(o) for o in json.loads(path.read_text())]
                view = view.model_copy(update={"gate": view.gate.model_copy(update={"per_prompt": outcomes})})
        return view

    def _match(self, views: Views, candidate_id: str) -> CandidateView:
        matches = [v for v in views if v.candidate_id.startswith(candidate_id)]
        if len(candidate_id) < MIN_PREFIX or not matches:
            raise CandidateNotFoundError(f"no candidate {candidate_id!r} in scenario {self.scenario}")
        if len(matches) > 1:
            raise CandidateNotFoundError(f"{candidate_id!r} matches {len(matches)} candidates; give more of the id")
        return matches[0]

    # --- writing ------------------------------------------------------------------------------

    def register(self, candidate_dir: Path | str, artifacts: ArtifactStore | None = None) -> CandidateView:
        """Import a recipe's candidate folder (weights, or a harness tree when its candidate.json says
        kind "harness"); the existing view when this content is registered."""
        src = Path(candidate_dir)
        candidate = Candidate.read_if_any(src) or Candidate(path=src)
        if candidate.scenario not in (None, self.scenario):
            raise CandidateError(f"{src} is a candidate for {candidate.scenario}, not {self.scenario}")
        store = artifacts or ArtifactStore.for_data_dir(self.data_dir)
        if candidate.kind == "harness":
            manifest = store.import_harness(src, lineage=candidate.lineage.given())
        else:
            manifest = store.import_candidate(src)
        event = CandidateEvent(candidate_id=manifest.content_id, event="registered", data={
            "kind": manifest.kind, "source": str(src.resolve()), "source_id": candidate.id,
            "created_at": utcnow().isoformat(),
            "lineage": manifest.lineage.model_dump(mode="json") if manifest.lineage else None,
            "train_metrics": candidate.metrics, "training_log": candidate.training_log,
            **({"mutations": candidate.mutations} if candidate.mutations else {}),
        })

        def build(events: Events) -> CandidateEvent | None:
            # Registered already (by this process or another): nothing appended, the existing view returned.
            return None if manifest.content_id in self._fold(events) else self._checked(events, event)

        self.log.append(build)
        return self.get(manifest.content_id)

    def record_gate(self, candidate_id: str, result: GateResult) -> CandidateView:
        event = CandidateEvent(candidate_id=candidate_id, event="evaluated",
                               data=result.model_dump(mode="json", exclude={"per_prompt"}))

        def build(events: Events) -> CandidateEvent:
            self._checked(events, event)  # before the outputs: a refused result must not replace the last one's
            if result.per_prompt is not None:
                (self.dir / GATE_DIR).mkdir(parents=True, exist_ok=True)
                replace_atomically(
                    self.dir / GATE_DIR / f"{candidate_id}.json",
                    json.dumps([o.model_dump(mode="json") for o in result.per_prompt]).encode(), fsync=self.fsync,
                )
            return event

        self.log.append(build)
        return self.get(candidate_id)

    def reject(self, candidate_id: str, reason: str, by: str | None = None) -> CandidateView:
        def build(events: Events) -> CandidateEvent:
            view = self._match(sorted(self._fold(events).values(), key=lambda v: v.created_at), candidate_id)
            if view.status == "released":
                raise CandidateStateError(f"{view.candidate_id[:12]} is released as {view.release_id}: "
                                          "roll back instead")
            return self._checked(events, CandidateEvent(candidate_id=view.candidate_id, event="rejected", by=by,
                                                        data={"reason": reason}))

        appended = self.log.append(build)
        assert appended is not None
        return self.get(appended.candidate_id)

    def mark_released(self, candidate_id: str, release_id: str, by: str | None = None) -> None:
        self._append(CandidateEvent(candidate_id=candidate_id, event="released", by=by,
                                    data={"release_id": release_id}))

    def check(self, event: CandidateEvent) -> None:
        """Raise CandidateStateError unless the candidate's current state allows `event`."""
        self._checked(self.events(), event)

    def _checked(self, events: Events, event: CandidateEvent) -> CandidateEvent:
        """`event`, if the candidate's state after `events` allows it; CandidateStateError otherwise."""
        current = self._fold(events).get(event.candidate_id)
        try:
            TRANSITIONS.check(current.state if current else None, _next_state(event), event.candidate_id[:12])
        except IllegalTransitionError as exc:
            raise CandidateStateError(f"{exc} ({event.event} event refused)") from None
        return event

    def _append(self, event: CandidateEvent) -> None:
        """Append one event if the candidate's state, under the log's lock, allows it."""
        self.log.append(lambda events: self._checked(events, event))


def register_candidate(data_dir: Path | str, candidate_dir: Path | str, scenario: str | None = None, *,
                       url: str | None = None) -> CandidateView:
    """Register a recipe's candidate folder under its scenario (read from its candidate.json)."""
    if scenario is None:
        candidate = Candidate.read_if_any(candidate_dir)
        if candidate is None:
            raise CandidateError(f"{candidate_dir} has no candidate.json; pass the scenario")
        if candidate.scenario is None:
            raise CandidateError(f"{candidate_dir}'s candidate.json names no scenario; pass it")
        scenario = candidate.scenario
    return CandidateRegistry(data_dir, scenario, url=url).register(candidate_dir)


def find_candidate(data_dir: Path | str, candidate_id: str, *, url: str | None = None) -> CandidateView:
    """A candidate of any scenario, by id or unique prefix."""
    found: Views = []
    for scenario in CandidateRegistry.scenarios(data_dir, url):
        try:
            found.append(CandidateRegistry(data_dir, scenario, url=url).get(candidate_id, details=True))
        except CandidateNotFoundError:
            continue
    if len(found) != 1:
        raise CandidateNotFoundError(f"no candidate {candidate_id!r}" if not found
                                     else f"{candidate_id!r} is ambiguous across scenarios")
    return found[0]
