"""Infrastructure faults are not judgements: the gate's sign test against a known table, which
exceptions count as faults and how a sample is retried, the candidate's `void` state, and, with a
real engine behind a proxy that stalls or 503s chosen requests, void pairs left out of both arms
while the rest are judged, and a gate with too few valid pairs that does not reject; the learner
gates a void candidate again within `learner.gate_retries`."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
import yaml

from reef.config import GateSettings, ServeConfig, resolve
from reef.core.chat import ChatError
from reef.gate.arms import HarnessArms, Weights
from reef.gate.evaluate import evaluate_candidate, gate_weights
from reef.gate.faults import Void, fault_of, with_retries
from reef.gate.stats import sign_test
from reef.learn.learner import Learner
from reef.learn.round_log import RoundLog
from reef.registry.candidates import TRANSITIONS, CandidateEvent, CandidateRegistry, GateResult, register_candidate
from reef.registry.harness import Harness
from reef.sampling.engine import EngineEndpoint, GateEngineError
from reef.scenario import eval_suite, get_scenario
from tests.helpers import MODEL_NAME, gated_tasks
from tests.helpers.tiny import rules as demo

pytestmark = [pytest.mark.model_free, pytest.mark.any_model]

# --- the sign test --------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "k", "p"), [
    (10, 1, 0.021484375), (20, 5, 0.04138946533203125), (5, 0, 0.0625), (0, 0, 1.0),
    (1, 1, 1.0), (6, 0, 0.03125), (10, 5, 1.0), (12, 2, 0.03857421875),
])
def test_sign_test_matches_the_exact_binomial_table(n: int, k: int, p: float) -> None:
    assert sign_test(k, n - k) == p
    assert sign_test(n - k, k) == p  # two-sided: which arm won does not matter


def test_sign_test_keeps_small_tails_exact() -> None:
    assert sign_test(0, 200) == 2.0 / 2**200  # exact integers: no tail term rounds away
    with pytest.raises(ValueError):
        sign_test(-1, 3)


# --- which errors are faults, and retries -----------------------------------------------------------


def _wrapped(cause: BaseException) -> GateEngineError:
    try:
        raise GateEngineError("reef-tiny: wrapped") from cause
    except GateEngineError as exc:
        return exc


def test_timeouts_transport_errors_and_5xx_are_faults_but_a_refused_request_is_not() -> None:
    assert fault_of(_wrapped(httpx.ReadTimeout("slow"))) == "ReadTimeout"
    assert fault_of(_wrapped(httpx.ConnectError("refused"))) == "ConnectError"
    assert fault_of(_wrapped(ChatError("u", 503, "overloaded"))) == "HTTP 503"
    assert fault_of(_wrapped(ChatError("u", 429, "busy"))) == "HTTP 429"
    assert fault_of(_wrapped(ChatError("u", 400, "prompt too long"))) is None  # retrying cannot help
    assert fault_of(_wrapped(ChatError("u", 200, "{}", problem="no choices"))) is None
    assert fault_of(ValueError("reward failed")) is None
    try:  # an error raised while handling a fault is not one itself
        try:
            raise httpx.ReadTimeout("slow")
        except httpx.ReadTimeout:
            raise ValueError("bug in the handler")  # noqa: B904 - the implicit context is the point
    except ValueError as exc:
        assert fault_of(exc) is None


def test_a_sample_is_retried_within_the_budget_then_void() -> None:
    calls: list[int] = []

    def flaky(failures: int, error: BaseException) -> Callable[[], Any]:
        async def attempt() -> str:
            calls.append(1)
            if len(calls) <= failures:
                raise _wrapped(error)
            return "reply"
        return attempt

    assert asyncio.run(with_retries(flaky(2, httpx.ReadTimeout("slow")), 2, 0.0)) == "reply"
    assert len(calls) == 3
    calls.clear()
    assert asyncio.run(with_retries(flaky(5, ChatError("u", 502, "bad gateway")), 2, 0.0)) == Void("HTTP 502", 3)
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(GateEngineError):  # not a fault: raised at once, never retried
        asyncio.run(with_retries(flaky(5, ChatError("u", 400, "bad request")), 2, 0.0))
    assert len(calls) == 1


# --- the candidate's void state ---------------------------------------------------------------------


def test_a_void_gate_neither_selects_nor_rejects_and_may_run_again(tmp_path: Path) -> None:
    cid = "d" * 64
    registry = CandidateRegistry(tmp_path, demo.SCENARIO, fsync=False)
    # A candidate without an artifact: the state machine is what is tested.
    registry._append(CandidateEvent(candidate_id=cid, event="registered",
                                    data={"kind": "harness", "created_at": "2026-01-01T00:00:00+00:00"}))

    def gate(decision: Literal["select", "reject", "void"]) -> GateResult:
        return GateResult(decision=decision, reason="test", head_release_id=f"{demo.SCENARIO}@r0")

    assert registry.record_gate(cid, gate("void")).status == "void"
    assert not TRANSITIONS.final("gate_void")
    assert registry.record_gate(cid, gate("select")).status == "selected"
    assert registry.record_gate(cid, gate("void")).status == "void"  # its last gate proves nothing: not releasable
    assert registry.record_gate(cid, gate("reject")).status == "rejected"


# --- a real engine behind a faulty proxy ------------------------------------------------------------

STALL, UNAVAILABLE = "stall", "503"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the gate opens up to `concurrency` connections at once; the default 5 resets some


class FaultyProxy:
    """An HTTP proxy in front of the real engine: `rule(word, arm, attempt)` says, per chat request,
    whether to stall it (until the test ends: the client times out), answer 503, or pass it on.
    `word` is the eval task's word, `arm` "candidate" when the request carries the candidate's
    harness, `attempt` counts that word and arm's requests from 1."""

    def __init__(self, upstream: str, rule: Callable[[str, str, int], str | None]) -> None:
        self.upstream, self.rule = upstream.rstrip("/"), rule
        self.attempts: Counter[tuple[str, str]] = Counter()
        self.stalled = threading.Event()  # set once a request is stalled
        self.release = threading.Event()  # lets stalled handlers go at teardown
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                proxy.forward(self, None)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                proxy.forward(self, self.rfile.read(int(self.headers["content-length"])))

            def log_message(self, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def forward(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> None:
        action = self._action(json.loads(body)) if body and handler.path.endswith("/chat/completions") else None
        if action == STALL:
            self.stalled.set()
            self.release.wait()
            return  # the client gave up long ago; nothing to answer
        if action == UNAVAILABLE:
            status, headers, content = 503, {"content-type": "application/json"}, b'{"error": "overloaded"}'
        else:
            with httpx.Client(timeout=120) as client:
                got = client.request(handler.command, self.upstream + handler.path, content=body,
                                     headers={"content-type": "application/json"} if body else None)
            status, headers, content = got.status_code, {"content-type": got.headers["content-type"]}, got.content
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("content-length", str(len(content)))
        handler.end_headers()
        handler.wfile.write(content)

    def _action(self, body: dict[str, Any]) -> str | None:
        messages = body["messages"]
        word = messages[-1]["content"].removeprefix("Word: ")
        arm = "candidate" if RULE in (messages[0].get("content") or "") else "head"
        with self.lock:
            self.attempts[word, arm] += 1
            attempt = self.attempts[word, arm]
        return self.rule(word, arm, attempt)

    def __enter__(self) -> FaultyProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


RULE = demo.RULE_LABEL
HARNESS = HarnessArms(Harness("", {"rules.md": f"- {RULE}\n"}), None, "system_prepend")


def _words(suite: Any) -> list[str]:
    return [t["messages"][-1]["content"].removeprefix("Word: ") for t in suite.tasks]


@pytest.mark.vllm
def test_faulted_pairs_are_void_in_both_arms_and_the_rest_are_judged(vllm_url: str) -> None:
    suite = eval_suite(get_scenario(demo.SCENARIO))
    suite.tasks = suite.tasks[:12]
    words = _words(suite)
    down, stalled, flaky = words[0], words[1], words[2]

    def rule(word: str, arm: str, attempt: int) -> str | None:
        if word == down and arm == "head":
            return UNAVAILABLE  # every try: void, and the candidate's replies go with it
        if word == stalled and arm == "candidate":
            return STALL  # every try times out (ReadTimeout)
        if word == flaky and attempt == 1:
            return UNAVAILABLE  # the retry gets through: judged
        return None

    config = GateSettings(samples=1, fault_retries=1, fault_backoff_s=0.0, request_timeout_s=10.0, min_valid_pairs=8)
    with FaultyProxy(vllm_url, rule) as proxy:
        weights = Weights(Path("unused"), served=MODEL_NAME)  # both arms on the engine's own weights
        result = gate_weights(weights, weights, suite, config, engine=EngineEndpoint(proxy.url, MODEL_NAME),
                              progress=False, harnesses=HARNESS)
        assert proxy.stalled.is_set()
    assert result.backend == "engine" and result.decision in ("select", "reject"), result.reason
    assert result.void_pairs == 2 and result.prompts == 10, result.reason
    assert proxy.attempts[down, "head"] == proxy.attempts[stalled, "candidate"] == 2  # one try and one retry
    assert proxy.attempts[flaky, "candidate"] == proxy.attempts[flaky, "head"] == 2
    assert result.fault_retries == 4  # down, stalled, and both arms of flaky
    assert result.per_prompt is not None
    faults = {words[i]: o.fault for i, o in enumerate(result.per_prompt) if o.fault}
    assert faults == {down: "HTTP 503", stalled: "ReadTimeout"}
    for i, outcome in enumerate(result.per_prompt):
        if words[i] in faults:  # never scored, in neither arm
            assert outcome.candidate_replies == outcome.head_replies == []
            assert outcome.candidate_score is None and outcome.head_score is None
        else:
            assert len(outcome.candidate_replies) == len(outcome.head_replies) == 1
            assert outcome.candidate_score is not None and outcome.head_score is not None
    assert result.wins + result.losses + result.ties == 10
    assert result.sign_p == sign_test(result.wins, result.losses)
    assert "2 pairs void (2 engine faults: 1 HTTP 503, 1 ReadTimeout)" in result.reason
    assert "sign test" in result.reason


@pytest.mark.vllm
def test_too_few_valid_pairs_void_the_gate_and_the_candidate_is_not_rejected(
        vllm_url: str, serving_model: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    folder = tmp_path / "harness"
    folder.mkdir()
    (folder / "rules.md").write_text(f"- {RULE}\n")
    (folder / "candidate.json").write_text(json.dumps({"kind": "harness", "scenario": demo.SCENARIO,
                                                       "lineage": {"recipe": "hand-written"}}))
    view = register_candidate(data, folder)
    words = _words(eval_suite(get_scenario(demo.SCENARIO)))
    answered = set(words[:3])
    config = GateSettings(samples=1, fault_retries=1, fault_backoff_s=0.0)

    with FaultyProxy(vllm_url, lambda word, arm, attempt: None if word in answered else UNAVAILABLE) as proxy:
        result = evaluate_candidate(data, view.candidate_id, config, base_model=str(serving_model),
                                    engine=EngineEndpoint(proxy.url, MODEL_NAME), progress=False)
    assert result.decision == "void", result.reason
    missing = len(words) - 3
    assert result.reason == (f"gate void: 3 of {len(words)} pairs valid, 16 needed "
                             f"({missing} engine faults: HTTP 503)")
    assert result.void_pairs == missing and result.ci_low is None and result.sign_p is None
    registry = CandidateRegistry(data, demo.SCENARIO)
    after = registry.get(view.candidate_id)
    assert after.status == "void" and after.state == "gate_void" and after.gate is not None
    assert after.gate.decision == "void"
    # Nothing was judged, so the same candidate is gated again once the engine answers.
    again = evaluate_candidate(data, view.candidate_id, config, engine=EngineEndpoint(vllm_url, MODEL_NAME),
                               progress=False)
    assert again.decision in ("select", "reject") and again.void_pairs == 0, again.reason
    assert again.prompts == gated_tasks(again.model_dump(), len(words))
    assert registry.get(view.candidate_id).status == ("selected" if again.decision == "select" else "rejected")


@pytest.fixture
def unreachable() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    url = f"http://127.0.0.1:{server.server_port}"
    server.server_close()  # nothing listens there any more: every connection is refused
    yield url


def test_an_engine_down_before_sampling_voids_the_gate(serving_model: Path, unreachable: str,
                                                        tmp_path: Path) -> None:
    """The fault in the issue: the engine errors outside any task, so nothing is judged at all."""
    data = tmp_path / "data"
    folder = tmp_path / "harness"
    folder.mkdir()
    (folder / "rules.md").write_text(f"- {RULE}\n")
    (folder / "candidate.json").write_text(json.dumps({"kind": "harness", "scenario": demo.SCENARIO}))
    view = register_candidate(data, folder)
    result = evaluate_candidate(data, view.candidate_id, GateSettings(samples=1), base_model=str(serving_model),
                                engine=EngineEndpoint(unreachable, MODEL_NAME), progress=False)
    assert result.decision == "void" and result.reason.startswith("gate void: engine fault (ConnectError)")
    assert CandidateRegistry(data, demo.SCENARIO).get(view.candidate_id).status == "void"


def _void_round(tmp_path: Path, model: Path, engine_url: str) -> tuple[ServeConfig, str, RoundLog, str]:
    """A learner's serve.yaml, and a round whose harness candidate's gate through `engine_url` was
    void, logged as reef.learn.round leaves it: (config, candidate id, the round log, the round id)."""
    data, folder = tmp_path / "data", tmp_path / "harness"
    folder.mkdir()
    (folder / "rules.md").write_text(f"- {RULE}\n")
    (folder / "candidate.json").write_text(json.dumps({"kind": "harness", "scenario": demo.SCENARIO}))
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump({
        "data_dir": str(data), "model": str(model), "served_model_name": MODEL_NAME,
        "learner": {"enabled": True, "gate_retries": 2},
        "release": {"gate": {"samples": 1, "fault_retries": 0}},
        "recipes": {"mine": {"recipe": "harness_evolve", "params": {"proposer": "mined"}}},
        "scenarios": {demo.SCENARIO: {"recipe": "mine"}}}))
    config, _ = resolve(config_file=tmp_path / "serve.yaml")
    view = register_candidate(data, folder)
    first = evaluate_candidate(data, view.candidate_id, config.release.gate, base_model=str(model),
                               engine=EngineEndpoint(engine_url, MODEL_NAME), progress=False)
    assert first.decision == "void", first.reason
    log = RoundLog.for_data_dir(data, demo.SCENARIO)
    rnd = log.begin("harness_evolve")
    for state, details in (("snapshotted", {}), ("trained", {"candidate_path": str(folder)}),
                           ("registered", {"candidate_id": view.candidate_id}),
                           ("gated", {"decision": "void", "reason": first.reason}), ("done", {})):
        log.append(rnd, state, **details)  # type: ignore[arg-type]
    return config, view.candidate_id, log, rnd.round_id


def test_the_learner_gates_a_void_candidate_again_within_its_budget(unreachable: str, tmp_path: Path) -> None:
    """A round whose gate was void (the engine down): the learner gates its candidate again before
    any new round, in the round process, `gate_retries` times, each try in the register and in
    rounds.jsonl with the reason in its status; then the candidate stays void and the learner goes on."""
    model = tmp_path / "model"
    model.mkdir()  # r0's weights: a harness gate on the engine loads none
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"not read")
    config, cid, log, round_id = _void_round(tmp_path, model, unreachable)
    data = Path(config.data_dir)

    learner = Learner(config, engine_url=unreachable, engine_model=MODEL_NAME)
    state = learner.scenarios[demo.SCENARIO]
    assert learner.plan_tick() == demo.SCENARIO  # due for its void gate, with no record waiting
    assert state.void_gate is not None and state.void_gate["retries"] == 0
    assert state.void_gate["reason"].startswith("gate void: engine fault (ConnectError)")
    for tries in (1, 2):
        assert learner.tick() == demo.SCENARIO
        assert state.last_error is None and state.last is not None, state.last_error
        assert state.last["status"] == "regated" and state.last["gate"]["decision"] == "void", state.last
        assert learner.describe()["scenarios"][demo.SCENARIO]["void_gate"]["retries"] == tries
    assert learner.plan_tick() is None  # the budget is spent: no more gates, nothing else to do
    shown = learner.describe()["scenarios"][demo.SCENARIO]["void_gate"]
    assert shown["next"] == f"left void after 2 retries; gate it again with `reef gate {cid[:12]}`"
    registry = CandidateRegistry(data, demo.SCENARIO)
    gates = [e for e in registry.events() if e.event == "evaluated"]
    assert [g.data["decision"] for g in gates] == ["void"] * 3 and registry.get(cid).status == "void"
    logged = [json.loads(line) for line in (data / "learner" / "rounds.jsonl").read_text().splitlines()]
    assert [(e["status"], e["candidate_id"], e["gate"]["decision"]) for e in logged] == [
        ("regated", cid, "void")] * 2
    assert log.current() is not None and log.current().round_id == round_id  # no new round was started


@pytest.mark.vllm
def test_the_learner_retries_a_void_gate_and_the_retry_judges(vllm_url: str, serving_model: Path,
                                                              tmp_path: Path) -> None:
    """The engine answers 503 to every request of the round's gate (void), then recovers: the
    learner's first retry judges the candidate, and nothing more is retried."""
    down = threading.Event()
    down.set()
    with FaultyProxy(vllm_url, lambda word, arm, attempt: UNAVAILABLE if down.is_set() else None) as proxy:
        config, cid, _, _ = _void_round(tmp_path, serving_model, proxy.url)
        down.clear()
        learner = Learner(config, engine_url=proxy.url, engine_model=MODEL_NAME)
        state = learner.scenarios[demo.SCENARIO]
        assert learner.tick() == demo.SCENARIO
    assert state.last is not None and state.last["status"] == "regated", (state.last, state.last_error)
    decision = state.last["gate"]["decision"]
    assert decision in ("select", "reject"), state.last
    view = CandidateRegistry(Path(config.data_dir), demo.SCENARIO).get(cid)
    assert view.status == ("selected" if decision == "select" else "rejected")
    assert view.gate is not None and view.gate.void_pairs == 0
    assert state.void_candidate() is None and state.void_gate is None  # judged: no budget left to spend
