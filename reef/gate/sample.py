"""The gate's replies: both arms answer every eval task `samples` times with the scenario's
`max_new_tokens` and temperature (a scenario with an `environment` in episodes: its tool calls are
executed and the model goes on until its final answer, reef.scenario.environment).

Through the serving engine (vLLM's OpenAI server) when the candidate is a LoRA, or a harness on
weights the engine serves: a LoRA is loaded under a temporary adapter name (reef.sampling.engine),
and both arms' requests are interleaved so the engine batches them together. Full-weight
candidates, and every gate without an engine or without a free adapter slot, sample with
transformers instead: one engine cannot hold two sets of full weights on CPU.

The head's replies on the engine are kept between gates (reef.gate.head_replies): a task whose
head replies an earlier gate or the learner's warm-up sampled is sampled in the candidate's arm only.

An infrastructure fault is not a judgement (reef.gate.faults): an engine request that times out,
loses its connection or gets a 5xx is retried (`fault_retries`) with the same seed; a task still
failing is void, its replies left out of both arms. A fault outside any one task (the probe) is a
GateFaultError.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tqdm.auto import tqdm

from reef.config import GateSettings
from reef.gate.arms import ARMS, HarnessArms, Weights
from reef.gate.faults import GateFaultError, Void, with_retries
from reef.gate.head_replies import HeadReplies, head_keys
from reef.sampling.completion import texts
from reef.sampling.engine import Arm, EngineEndpoint, EngineSession, NoFreeSlotError, run_session, taking_turns
from reef.sampling.episodes import run_episodes
from reef.scenario import EvalSuite, Task

Outputs = dict[str, list[list[str]]]


@dataclass
class Replies:
    """What the arms answered: replies per arm (a void task's are empty in both), the fault of each
    void task, the retries spent, the candidate's probe reply, and which backend sampled (`note`:
    why not the engine, when it was asked first)."""

    outputs: Outputs
    probe: str = ""
    faults: dict[int, str] = field(default_factory=dict)
    retries: int = 0
    backend: Literal["engine", "transformers"] = "transformers"
    note: str = ""
    head_reused: int = 0  # tasks whose head replies were kept from an earlier gate or warm-up (reef.gate.head_replies)


def sample_arms(candidate: Weights, head: Weights, suite: EvalSuite, samples: int, config: GateSettings, *,
                engine: EngineEndpoint | None = None, data_dir: Path | str | None = None, progress: bool = True,
                harnesses: HarnessArms | None = None, kept: HeadReplies | None = None) -> Replies:
    """Both arms' replies to `suite`: through `engine` when the candidate is a LoRA (or a harness,
    both arms on the head's weights) and the head runs on the engine's base weights (`head.served`
    or an adapter), else with transformers; `data_dir` is where gates sharing the engine take turns.
    `kept`: the head replies an earlier gate or warm-up sampled on the engine, reused and added to."""
    arm_tasks = _arm_tasks(suite, harnesses)
    note = ""
    on_engine = candidate.adapter is not None or (harnesses is not None and candidate == head)
    if engine is not None and on_engine and (head.served or head.adapter):
        try:
            with taking_turns(Path(data_dir) if data_dir is not None else None):
                return _engine_replies(engine, {"candidate": candidate, "head": head}, suite, arm_tasks, samples,
                                       config, progress, kept)
        except NoFreeSlotError as exc:
            note = f" (engine: {exc}, so transformers sampled)"
    outputs, probe = _transformers_outputs(candidate, head, suite, arm_tasks, samples, config, progress)
    return Replies(outputs, probe, note=note)


def sample_head(head: Weights, suite: EvalSuite, samples: int, config: GateSettings, engine: EngineEndpoint,
                kept: HeadReplies, *, data_dir: Path | str | None = None, progress: bool = True,
                harnesses: HarnessArms | None = None) -> Replies:
    """The head arm's replies alone, through `engine`, kept in `kept` as each task's arrive (the
    learner's warm-up before a gate: reef.gate.warm); tasks already kept are not sampled."""
    arm_tasks = _arm_tasks(suite, harnesses)
    with taking_turns(Path(data_dir) if data_dir is not None else None):
        return _engine_replies(engine, {"head": head}, suite, arm_tasks, samples, config, progress, kept)


def _arm_tasks(suite: EvalSuite, harnesses: HarnessArms | None) -> dict[str, list[Task]]:
    """Each arm's tasks: with its harness applied, or as the suite has them."""
    return harnesses.tasks(suite) if harnesses is not None else {arm: list(suite.tasks) for arm in ARMS}


def _transformers_outputs(candidate: Weights, head: Weights, suite: EvalSuite, arm_tasks: dict[str, list[Task]],
                          samples: int, config: GateSettings, progress: bool) -> tuple[Outputs, str]:
    # torch and transformers only here: a gate on the engine runs without them.
    import torch

    from reef.sampling.load import load_model
    from reef.sampling.transformers import TransformersSampler

    tools = [t.get("tools") for t in suite.tasks] if any(t.get("tools") for t in suite.tasks) else None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small model's ops are too small for a second thread to help
    outputs: Outputs = {}
    probe = ""
    loaded: dict[Weights, Any] = {}
    try:
        for arm, weights in tqdm([("candidate", candidate), ("head", head)], desc="gate", disable=not progress):
            if weights not in loaded:  # a harness candidate runs on the head's weights: load them once
                loaded = {weights: load_model(weights.model, weights.adapter)}
            sampler = TransformersSampler(*loaded[weights])
            if suite.environment is not None:  # multi-turn: the environment executes the tool calls
                got = run_episodes(sampler, arm_tasks[arm], suite.environment, suite.max_turns, samples,
                                   max_new_tokens=suite.max_new_tokens, temperature=suite.temperature, seed=suite.seed)
            else:
                prompts = [t["messages"] for t in arm_tasks[arm]]
                got = sampler.sample(prompts, samples, max_new_tokens=suite.max_new_tokens,
                                     temperature=suite.temperature, seed=suite.seed, tools=tools)
            outputs[arm] = texts(got)
            if arm == "candidate" and config.probe_tokens:
                probe = sampler.sample(suite.prompts[:1], 1, max_new_tokens=config.probe_tokens, temperature=0.0,
                                       seed=0)[0][0].text
    finally:
        torch.set_num_threads(threads)
    return outputs, probe


def _engine_replies(engine: EngineEndpoint, weights: dict[str, Weights], suite: EvalSuite,
                    arm_tasks: dict[str, list[Task]], samples: int, config: GateSettings, progress: bool,
                    kept: HeadReplies | None) -> Replies:
    keys = head_keys(weights["head"].content, arm_tasks["head"], suite, samples) if kept is not None else None
    reused = {i: got for i, key in enumerate(keys or []) if kept is not None and (got := kept.get(key)) is not None}
    arms = list(weights)

    async def body(session: EngineSession) -> Replies:
        names = dict(zip(arms, await session.prepare([Arm(weights[a].served, weights[a].adapter) for a in arms]),
                         strict=True))
        # Both arms interleaved, so the engine batches them together and stays busy.
        jobs = [(arm, i) for i in range(len(suite.tasks)) for arm in arms if not (arm == "head" and i in reused)]
        bar = tqdm(total=len(jobs), desc="gate (engine)", disable=not progress)
        tries = [0]

        async def once(arm: str, i: int) -> list[str]:
            tries[0] += 1
            return await session.replies(names[arm], dict(arm_tasks[arm][i]), suite.environment, suite.max_turns,
                                         samples=samples, max_tokens=suite.max_new_tokens,
                                         temperature=suite.temperature, seed=suite.seed + i)

        async def one(arm: str, i: int) -> list[str] | Void:
            # A retry sends the same seed: it samples the replies the first try would have.
            got = await with_retries(lambda: once(arm, i), config.fault_retries, config.fault_backoff_s)
            if arm == "head" and keys is not None and kept is not None and not isinstance(got, Void):
                kept.put(keys[i], got)
            bar.update(1)
            return got

        tasks = [asyncio.ensure_future(one(arm, i)) for arm, i in jobs]
        try:
            got = await asyncio.gather(*tasks)
        except BaseException:  # no request may outlive the adapters it runs on
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            bar.close()
        run = Replies({arm: [[] for _ in suite.tasks] for arm in ARMS}, backend="engine",
                      head_reused=len(reused))
        for i, kept_replies in reused.items():
            run.outputs["head"][i] = kept_replies
        for (arm, i), replies in zip(jobs, got, strict=True):
            if isinstance(replies, Void):
                run.faults.setdefault(i, replies.fault)
            else:
                run.outputs[arm][i] = replies
        for i in run.faults:  # out of both arms: one arm's replies alone pair with nothing
            run.outputs["candidate"][i], run.outputs["head"][i] = [], []
        if config.probe_tokens and "candidate" in names:
            # What the swap's canary request (temperature 0, seed 0, messages only) must reproduce.
            probe = await with_retries(lambda: session.weights.greedy(
                names["candidate"], list(suite.prompts[0]), config.probe_tokens), config.fault_retries,
                config.fault_backoff_s)
            if isinstance(probe, Void):
                raise GateFaultError(f"the probe request faulted {probe.attempts} times: {probe.fault}")
            run.probe = probe
        run.retries = tries[0] - len(jobs)
        return run

    return run_session(engine, config.concurrency, body, config.request_timeout_s)
