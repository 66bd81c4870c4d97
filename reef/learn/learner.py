"""The learner inside `reef serve`: learning rounds for every scenario that declares a recipe.

Each scenario has its own round plan (serve.yaml `scenarios.<s>.recipe`, see reef.learn.plan), so
its own snapshot, consumed ledger, candidates and release chain. Every `interval_s` the learner
counts what waits for each scenario's recipe, and runs one round (snapshot -> train -> register ->
gate, `python -m reef.learn.round`) for the next scenario in round-robin order whose counts reached
its thresholds: a scenario with steady traffic cannot starve another.

A round waits for enough signal, not for the first record (reef.learn.plan.Thresholds): at least
`min_records` eligible new records, and of the eligible ones `min_rewarded` rewarded and
`min_unrewarded` unrewarded (learner.min_*, or the recipe setting's; a count the recipe does not
learn from is not waited for). Until then the scenario's `waiting` (in `GET /reef/status`) says why,
e.g. `waiting: 3 of 4 rewarded, 12 of 4 unrewarded, 15 of 16 records`.

Rounds run in a separate process, one at a time. On the 2-core machines Reef targets, vLLM keeps
one core busy and the gateway the other; two training processes would share the same core, each
taking twice as long (and twice the memory, each gate loading two models), so concurrency would
only delay every scenario's first candidate. The gateway only polls the counts, so serving never
waits for a round, and another scenario's releases (API, dashboard, canary) go on while one trains.
The round process runs `learner.round_nice` steps below the server (one torch thread), so users'
requests keep the CPU while it trains; its own engine requests are served beside the users'.

While the own recipe waits for rewarded records, the learner climbs a ladder instead of waiting
(per scenario, the reason in `GET /reef/status` and `reef status`): with a few rewarded records in,
a harness round shows them as few-shot examples (reef.learn.harness_rung, `harness: 3 rewarded
replies as few-shot examples`); when that released nothing and rewards stay rare, exploration
rounds (reef.learn.ladder, `exploring: 0 of 4 rewarded in 20 reported records`). A round of the
scenario's own recipe, once due, always goes first.

A candidate the gate selects is released at once when its scenario's policy is `auto` (through the
same publisher as the API, expecting the head the gate compared against); under `approval` it
waits in `GET /reef/candidates`. The round process gets one `RoundRequest` (the plan, serve.yaml's
`release.gate`, the engine, the config file) and answers one `RoundResult` (reef.learn.plan), which
is appended to `<data_dir>/learner/rounds.jsonl`.

A gate that could not judge (engine faults, too few pairs scored in both arms: decision `void`)
is run again before the scenario's next round, in the round process (`RoundRequest.regate`), at
most `learner.gate_retries` times (reef.learn.regate); each try is a gate result in the candidate
register and a `regated` line in rounds.jsonl, and the scenario's `void_gate` in `GET /reef/status`
says where the candidate stands.

While no round is due, the learner has the next gate's head arm sampled ahead (`RoundRequest.warm`,
reef.gate.warm): the head's replies to the eval suite, kept for the gates against that head
(reef.gate.head_replies), so a round's gate samples the candidate's arm alone. Once per head, in
the round process, yielding to users like a round; a round that becomes due stops it (what it kept
stays kept), and the next idle check goes on from there. `release.gate.reuse_head_replies: false`
turns it off.

Each round is also a persisted state machine (reef.learn.round_log). A learner killed mid-round
(`kill -9` of `reef serve`; the round's process dies with it) finds the round open on its next
start and runs that scenario first: the round process resumes it from its last durable step or
abandons it (nothing consumed), and a round the gate had selected is released here by the policy,
or found already on the chain (a kill between the chain append and the register's event).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.config import ServeConfig
from reef.core.paths import DataDir
from reef.core.pg import STATE_URL_ENV
from reef.engine.supervisor import die_with_parent
from reef.learn.plan import RoundRequest, RoundResult
from reef.learn.round_log import Round
from reef.learn.scenario_learner import LearnerConfigError, ScenarioLearner, eligible, scenario_plans
from reef.registry.state import open_chain
from reef.sampling.engine import EngineEndpoint

if TYPE_CHECKING:
    from reef.serving.publisher import Publisher

__all__ = ["Learner", "LearnerConfigError", "ScenarioLearner", "round_preexec", "scenario_plans"]

log = logging.getLogger("reef.learner")


def round_preexec(nice: int) -> Callable[[], None]:
    """A round process's `preexec_fn`: it dies with the server (die_with_parent) and runs `nice` steps
    below it (learner.round_nice). Training then takes only the CPU the engine and the gateway leave;
    the round's own engine requests (rollouts, the gate) are served at the engine's priority."""

    def preexec() -> None:
        die_with_parent()
        if nice > 0:
            os.nice(nice)

    return preexec


class Learner:
    def __init__(self, config: ServeConfig, scenarios: dict[str, ScenarioLearner] | None = None,
                 engine_url: str | None = None, engine_model: str | None = None, users_url: str | None = None):
        """`users_url`: where the gateway counts users' calls in flight (its /metrics), which rounds
        yield to (learner.share); None: they do not."""
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.scenarios = scenarios if scenarios is not None else scenario_plans(config)
        if not (engine_url and engine_model):  # exploration samples through the engine
            for one in self.scenarios.values():
                one.exploration = None
        self.engine_url, self.engine_model, self.users_url = engine_url, engine_model, users_url
        self.publisher: Publisher | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.dir = DataDir(self.data_dir).learner()
        self.rounds_file = self.dir / "rounds.jsonl"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._last_ran: str | None = None  # the round-robin cursor
        self.last: dict[str, Any] | None = None
        for state in self.scenarios.values():
            state.gate_retries = config.learner.gate_retries

    def start(self, publisher: Publisher | None = None, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.publisher, self.loop = publisher, loop
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.scenarios:
            log.warning("learner enabled, but no scenario declares a recipe (scenarios.<s>.recipe)")
        self._thread = threading.Thread(target=self._loop, name="reef-learner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def describe(self) -> dict[str, Any]:
        """Per scenario under `scenarios`; the top level sums them up (any running, total rounds and
        pending records, the latest round and the latest standing error) and names, under `waiting`,
        each scenario whose round waits for more signal, with the reason."""
        per = {name: s.describe() for name, s in self.scenarios.items()}
        running = next((name for name, s in self.scenarios.items() if s.running), None)
        errors = [s.last_error for s in self.scenarios.values() if s.last_error]
        return {"enabled": True, "running": running is not None, "running_scenario": running,
                "rounds": sum(s.rounds for s in self.scenarios.values()),
                "pending": {"records": sum((s.pending or {}).get("records", 0) for s in self.scenarios.values())},
                "waiting": {name: d["waiting"] for name, d in per.items() if d["waiting"]},
                "last_round": self.last, "last_error": errors[0] if errors else None, "scenarios": per}

    def _order(self) -> list[str]:
        """Scenario names, starting after the one that ran the last round."""
        names = sorted(self.scenarios)
        if self._last_ran in names:
            at = names.index(self._last_ran) + 1
            names = names[at:] + names[:at]
        return names

    def _loop(self) -> None:
        while not self._stop.wait(self.config.learner.interval_s):
            self.tick()

    def plan_tick(self) -> str | None:
        """Count what waits for every scenario (each one's `pending` and `waiting` reason); the
        next scenario, in round-robin order, whose round is due, or None."""
        due = None
        for name in self._order():
            state = self.scenarios[name]
            try:
                state.count()
            except Exception as exc:  # noqa: BLE001 - one scenario's broken data must not stop the others
                log.exception("counting pending experience of %s failed", name)
                state.last_error = repr(exc)
                continue
            if due is None and state.due():
                due = name
        return due

    def tick(self) -> str | None:
        """Count what waits for every scenario, then run one round for the next due one; with none
        due, warm the next gate of a scenario whose head's replies are not all kept yet."""
        due = self.plan_tick()
        if due is None and not self._stop.is_set() and self._warm_next():
            due = self.plan_tick()  # the warm-up stopped for a round that became due: run it now
        if due is None or self._stop.is_set():
            return None
        self._last_ran = due
        state = self.scenarios[due]
        state.running = True
        idle_at, rounds = state.idle_at, state.rounds
        try:
            self._round(state)
        except Exception as exc:  # a broken round must never take the gateway down
            log.exception("learning round of %s failed", due)
            state.last_error = repr(exc)
        finally:
            state.running = False
            state.explored(idle_at, rounds)
        return due

    def _round(self, state: ScenarioLearner) -> None:
        if self._settle(state):  # an interrupted round the gate had selected: nothing to train
            return
        if self._retry_void(state):  # a void gate is retried before anything new is trained
            return
        learner = self.config.learner
        request = RoundRequest(plan=state.round_plan(), gate=self.config.release.gate, engine=self._engine(),
                               config_file=self.config.config_file,
                               launcher=learner.accelerate if learner.launcher == "accelerate" else None)
        started = time.time()
        result = self._run_request(state, request, "round")
        if result is None:
            return
        if result.status == "waiting":  # less signal than counted (another process took records): no round
            state.pending, state.waiting = result.pending, result.reason
            return
        state.last_error = result.reason if result.status == "busy" else None
        if result.status == "nothing_new":
            state.idle_at = eligible(state.pending or {})
        release = None
        if result.status == "trained" and result.candidate_id:
            release = self._maybe_release(state, result.candidate_id)
            if rnd := state.log.open_round():
                self._close_gated(state, rnd, release)
                result = result.model_copy(update={"round_state": rnd.state})
        seconds = round(time.time() - started, 1)
        entry = {"scenario": state.plan.scenario, "started_at": started, "seconds": seconds,
                 **result.model_dump(mode="json"), "release": release}
        self._append_round(entry)
        state.rounds += 1
        gate = result.gate
        last = {"scenario": result.scenario, "status": result.status, "seconds": seconds, "metrics": result.metrics,
                "candidate_id": result.candidate_id, "release": release,
                "candidate": result.candidate.id if result.candidate else None,
                "gate": {k: getattr(gate, k) if gate else None
                         for k in ("decision", "reason", "candidate_success", "head_success")}}
        state.last = self.last = last
        log.info("learning round of %s: %s", state.plan.scenario, last)

    def _retry_void(self, state: ScenarioLearner) -> bool:
        """Gate again the latest round's candidate whose gate was void, within `learner.gate_retries`
        (ScenarioLearner.void_candidate): in the round process (`RoundRequest.regate`), released under
        policy auto when selected now, each try appended to rounds.jsonl (status `regated`) as the
        register records its gate. True when there was one to retry."""
        candidate_id = state.void_candidate()
        if candidate_id is None:
            return False
        request = RoundRequest(plan=state.plan, gate=self.config.release.gate, engine=self._engine(),
                               config_file=self.config.config_file, regate=candidate_id)
        started = time.time()
        result = self._run_request(state, request, "regate")
        if result is None:
            return True
        state.last_error = result.reason if result.status == "busy" else None
        gate = result.gate
        release = self._maybe_release(state, candidate_id) if gate is not None and gate.decision == "select" else None
        seconds = round(time.time() - started, 1)
        entry = {"scenario": state.plan.scenario, "started_at": started, "seconds": seconds,
                 **result.model_dump(mode="json"), "release": release}
        self._append_round(entry)
        state.void_candidate()  # the status counts this try
        state.last = self.last = {
            "scenario": result.scenario, "status": result.status, "seconds": seconds, "candidate_id": candidate_id,
            "release": release, "gate": {k: getattr(gate, k) if gate else None
                                         for k in ("decision", "reason", "candidate_success", "head_success")}}
        log.info("gate of %s's void candidate %s again: %s", state.plan.scenario, candidate_id[:12], state.last)
        return True

    def _warm_next(self) -> bool:
        """Warm the next gate of the first scenario (round-robin order) whose head was not warmed
        yet (reef.gate.warm); True when a round became due and stopped it."""
        if not (self.engine_url and self.engine_model) or not self.config.release.gate.reuse_head_replies:
            return False
        heads = {name: open_chain(self.data_dir, name).head() for name in self._order()}
        name, head = next(((n, h) for n, h in heads.items() if h and self.scenarios[n].warmed != h.release_id),
                          (None, None))
        if name is None or head is None:
            return False
        state = self.scenarios[name]
        request = RoundRequest(plan=state.plan, gate=self.config.release.gate, engine=self._engine(),
                               config_file=self.config.config_file, warm=True)
        stopped = [False]

        def round_due() -> bool:
            stopped[0] = self.plan_tick() is not None or self._stop.is_set()
            return stopped[0]

        result = self._run_request(state, request, "warm", interrupt=round_due)
        if stopped[0]:
            return True
        if result is not None:
            state.warm = result.metrics or {"status": result.status, "reason": result.reason}
        # Done, or failed (`last_error` says why): tried once per head either way.
        if result is None or result.status != "warmed" or (result.metrics or {}).get("complete"):
            state.warmed = head.release_id
        return False

    def _engine(self) -> EngineEndpoint | None:
        if not (self.engine_url and self.engine_model):
            return None
        share = self.config.learner.share
        return EngineEndpoint(self.engine_url, self.engine_model, beside_users=share.beside_users,
                              per_user=share.per_user, alone=share.alone, users_url=self.users_url)

    def _append_round(self, entry: dict[str, Any]) -> None:
        """One line of `learner/rounds.jsonl`, synced before the learner goes on."""
        with self.rounds_file.open("a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _run_request(self, state: ScenarioLearner, request: RoundRequest, name: str, *,
                     interrupt: Callable[[], bool] | None = None) -> RoundResult | None:
        """Run `request` in a round process (its files named `name` in the scenario's learner folder);
        its result, or None with `last_error` set when the process failed. `interrupt`, asked every
        `interval_s` while it runs: True stops the process (None, no error)."""
        folder = self.dir / state.plan.scenario
        folder.mkdir(parents=True, exist_ok=True)
        request_file, out, log_path = folder / f"{name}-request.json", folder / f"{name}.json", folder / "rounds.log"
        request_file.write_text(request.model_dump_json(indent=2))
        out.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "reef.learn.round", "--request", str(request_file), "--out", str(out)]
        with log_path.open("ab") as log_file:
            self._process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                             env={**os.environ, "OMP_NUM_THREADS": "1", **self._state_env()},
                                             preexec_fn=round_preexec(self.config.learner.round_nice))
            code = self._wait(interrupt)
        if code is None:
            return None
        if code != 0 or not out.is_file():
            state.last_error = f"{name} process exited with code {code}; see {log_path}"
            return None
        return RoundResult.model_validate_json(out.read_text())

    def _state_env(self) -> dict[str, str]:
        """The state database for the round process (its round log, candidates, ledger, chain), as
        `reef serve` also sets it for itself: named here too, so a learner started another way agrees."""
        url = self.config.state.url
        return {STATE_URL_ENV: url} if url else {}

    def _wait(self, interrupt: Callable[[], bool] | None) -> int | None:
        """The round process's exit code; None when `interrupt` stopped it first."""
        assert self._process is not None
        while True:
            try:
                return self._process.wait(timeout=self.config.learner.interval_s if interrupt else None)
            except subprocess.TimeoutExpired:
                if interrupt is not None and interrupt():
                    self._process.terminate()
                    try:
                        self._process.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        self._process.kill()
                        self._process.wait()
                    return None

    def _settle(self, state: ScenarioLearner) -> bool:
        """Close a round an earlier learner left `gated`: find its candidate on the chain, or apply
        the policy to it now. True when there was one."""
        rnd = state.log.open_round()
        if rnd is None or rnd.state != "gated" or rnd.candidate_id is None:
            return False
        released = self._on_chain(state.plan.scenario, rnd.candidate_id)
        self._close_gated(state, rnd, released or self._maybe_release(state, rnd.candidate_id), resumed=True)
        return True

    def _close_gated(self, state: ScenarioLearner, rnd: Round, release_id: str | None, resumed: bool = False) -> None:
        if rnd.state != "gated":
            return
        if release_id:
            state.log.append(rnd, "released", resumed=resumed, release_id=release_id)
        else:
            policy = self.config.policy(state.plan.scenario)
            state.log.append(rnd, "done", resumed=resumed,
                             reason=state.last_error or f"selected; policy {policy} leaves the release to a person")

    def _on_chain(self, scenario: str, candidate_id: str) -> str | None:
        """The release that published this candidate, if one did (a kill after the chain append)."""
        return next((r.release_id for r in open_chain(self.data_dir, scenario).releases()
                     if r.content_id == candidate_id and r.operation == "train"), None)

    def _maybe_release(self, state: ScenarioLearner, candidate_id: str) -> str | None:
        """Under policy `auto`, release what the gate selected; the release id, or None."""
        if self.publisher is None or self.loop is None:
            return None
        from reef.registry.candidates import find_candidate

        view = find_candidate(self.data_dir, candidate_id, url=self.config.state.url)
        future = asyncio.run_coroutine_threadsafe(self.publisher.auto_release(view), self.loop)
        try:
            release = future.result(timeout=600)
        except Exception as exc:  # noqa: BLE001 - a refused release is reported, the learner goes on
            state.last_error = f"auto-release of {candidate_id[:12]} failed: {exc}"
            log.warning(state.last_error)
            return None
        return release.release_id if release else None
