"""`reef simulate`: plays a scenario's users against a running gateway.

Each simulated user asks one of the scenario's training prompts (`tasks:`) through the real OpenAI
SDK, scores the reply with the scenario's reward and reports the score on `/reef/report`
(`report=False`: never). A share of the users (`follow_up_share`) also react to the reply, in the
same conversation and without a session header (the gateway must stitch it into the first turn's
session), as a user who can tell a right answer from a wrong one would: a wrong reply gets the
doubt "Are you sure? Check it and answer again.", a right one "Thanks, that's right." The reaction
says only what such a user knows (right or wrong), never the expected answer; `reactions` bounds how
many times one user reacts (a doubt asks the model again; a thank-you ends the conversation after
its reply). A reply the reward cannot score gets no report (counted as `unscored`) and no reaction.
Where a task carries a `reference` reply, a user who rejects a reply to the task (not the reply
to a thank-you) also reports it as the `correction` (the fix a labelling or review application
sends): a target to learn from even while the model earns no reward at all (`corrections=False`:
never, the users of a rewards-only scenario). Each chat's start and duration, as the user waited for
it, go to `summary.latencies`.

For a scenario with an `environment`, each user is an agent instead: its session (`x-reef-session`)
runs model turns until the final answer, the environment executing every tool call on the client
side in between, and the session is reported as a whole (`session_id`) with the final answer's
score. Where the task carries its `reference` turns, a reviewer who knows the procedure watches
(a human in the loop): a wrong or missing tool call is replaced by the right one before it runs,
and each replaced turn, like a wrong final answer, gets its own report with the turn wanted as its
`correction`. Then `requests` is the number of sessions; `summary.requests` counts model calls.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import openai
from tqdm.auto import tqdm

from reef.scenario import (
    Environment,
    EpisodeState,
    Scenario,
    Task,
    correction,
    environment_for,
    get_scenario,
    reference_turn,
    reward_for,
    same_calls,
    training_tasks,
)
from reef.scenario.environment import reply_text
from reef.scenario.reward import RewardFn

if TYPE_CHECKING:
    from reef.config import ServeConfig

FOLLOW_UP = "Are you sure? Check it and answer again."
THANKS = "Thanks, that's right."
SATISFIED = 0.5  # a reply scored at least this is one the user accepts


@dataclass
class SimulationSummary:
    scenario: str
    requests: int = 0
    reports: int = 0
    errors: int = 0
    unscored: int = 0
    scores: list[float] = field(default_factory=list)
    sessions: dict[str, list[str]] = field(default_factory=dict)  # first record id -> record ids
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (time.time() sent, seconds) per chat

    @property
    def mean_score(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0

    def histogram(self) -> Counter[float]:
        return Counter(round(s, 2) for s in self.scores)

    def render(self) -> str:
        lines = [f"scenario {self.scenario}: {self.requests} chats, {self.reports} reports, "
                 f"{self.errors} errors, {self.unscored} unscored, mean score {self.mean_score:.3f}"]
        hist = self.histogram()
        width = max(hist.values(), default=1)
        for value in sorted(hist):
            lines.append(f"  score {value:4.2f} {'#' * max(1, 40 * hist[value] // width)} {hist[value]}")
        return "\n".join(lines)


async def _one_user(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, model: str, task: Task, reward: RewardFn,
    reactions: int, summary: SimulationSummary, temperature: float, max_tokens: int, report: bool,
    budget: list[int], corrections: bool = True,
) -> None:
    messages: list[dict[str, Any]] = list(task["messages"])
    extra = {"tools": task["tools"]} if task.get("tools") else {}
    record_ids: list[str] = []
    for turn in range(reactions + 1):
        if budget[0] <= 0:
            break
        budget[0] -= 1
        sent, t0 = time.time(), time.perf_counter()
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=temperature, **extra,  # type: ignore[arg-type]
        )
        summary.latencies.append((sent, time.perf_counter() - t0))
        completion = raw.parse()
        record_id = raw.headers["x-reef-agent-record-id"]
        # A tool call reaches the reward as the template writes it, as the gate and exploration score it.
        reply = reply_text(completion.choices[0].message.model_dump(exclude_none=True))
        # The reward may be blocking (a verifier, a judge over HTTP): off the event loop.
        score = (await asyncio.to_thread(reward, [task], [reply]))[0]
        summary.requests += 1
        record_ids.append(record_id)
        if score.value is None:
            summary.unscored += 1
            break  # the user cannot tell: no report, no reaction
        summary.scores.append(score.value)
        if report:
            metadata = {"turn": turn, **({"task_id": task["task_id"]} if "task_id" in task else {})}
            body = {"agent_record_id": record_id, "score": score.value, "feedback": score.feedback,
                    "metadata": metadata}
            # The reply to a thank-you answers the thanks, not the task: the task's reference is no fix for it.
            thanked = messages[-1].get("content") == THANKS
            if corrections and not thanked and (fix := correction(task, score.value, SATISFIED)) is not None:
                body["correction"] = fix
            resp = await http.post("/reef/report", json=body)
            resp.raise_for_status()
            summary.reports += 1
        if messages[-1].get("content") == THANKS:
            break  # the reply to a thank-you ends the conversation
        reaction = THANKS if score.value >= SATISFIED else FOLLOW_UP
        messages = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": reaction}]
    if record_ids:
        summary.sessions[record_ids[0]] = record_ids


async def _one_agent(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, model: str, task: Task, reward: RewardFn,
    environment: Environment, max_turns: int, summary: SimulationSummary, temperature: float, max_tokens: int,
    reviewed: bool = True,
) -> None:
    """One agent session: model turns through the gateway, the tool calls executed here by the
    scenario's environment (as a real agent's client executes them), then one report for the whole
    session on its final answer. With `reference` turns, a reviewer watches: a turn that does not
    make the reference's tool call is replaced by it (the session goes on from the right call), and
    each replaced turn, like a failed final answer, gets its own report with the wanted turn as its
    `correction`. `reviewed=False`: no reviewer (the session's report only)."""
    session_id = f"sim-{uuid.uuid4().hex}"
    state = EpisodeState(task, environment, max_turns)
    extra = {"tools": task["tools"]} if task.get("tools") else {}
    record_ids: list[str] = []
    fixes: list[tuple[str, dict[str, Any]]] = []  # (record id, the turn wanted there)
    while not state.done:
        sent, t0 = time.time(), time.perf_counter()
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=state.messages, max_tokens=max_tokens, temperature=temperature,  # type: ignore[arg-type]
            extra_headers={"x-reef-session": session_id}, **extra,
        )
        summary.latencies.append((sent, time.perf_counter() - t0))
        record_ids.append(raw.headers["x-reef-agent-record-id"])
        summary.requests += 1
        message = raw.parse().choices[0].message.model_dump(exclude_none=True)
        wanted = reference_turn(task, len(record_ids) - 1) if reviewed else None
        if wanted is not None and wanted.get("tool_calls") and not same_calls(message, wanted):
            fixes.append((record_ids[-1], wanted))
            message = {**wanted, "tool_calls": [{"id": f"call_{k}", **c} for k, c in enumerate(wanted["tool_calls"])]}
        await asyncio.to_thread(state.advance, message)
    score = (await asyncio.to_thread(reward, [task], [state.reply or ""]))[0]
    summary.sessions[record_ids[0]] = record_ids
    if score.value is None:
        summary.unscored += 1
        return
    wanted = reference_turn(task, len(record_ids) - 1) if reviewed else None
    if score.value < SATISFIED and wanted is not None and not wanted.get("tool_calls"):
        fixes.append((record_ids[-1], wanted))
    metadata = {"turns": state.turns, "tool_calls": state.tool_calls,
                **({"task_id": task["task_id"]} if "task_id" in task else {})}
    resp = await http.post("/reef/report", json={"session_id": session_id, "score": score.value,
                                                 "feedback": score.feedback, "metadata": metadata})
    resp.raise_for_status()
    summary.reports += 1
    summary.scores.append(score.value)
    for record_id, turn in fixes:  # after the session's report: a turn's own report is the latest
        resp = await http.post("/reef/report", json={"agent_record_id": record_id, "score": 0.0,
                                                     "correction": turn, "metadata": metadata})
        resp.raise_for_status()
        summary.reports += 1


def _declared(scenario: str | Scenario, config: ServeConfig | None) -> Scenario:
    return scenario if isinstance(scenario, Scenario) else get_scenario(scenario, config)


async def simulate_async(
    url: str, scenario: str | Scenario, requests: int = 200, concurrency: int = 8, seed: int = 0,
    follow_up_share: float = 0.2, temperature: float = 1.0, progress: bool = True,
    config: ServeConfig | None = None, max_tokens: int | None = None, report: bool = True, reactions: int = 1,
    corrections: bool = True,
) -> SimulationSummary:
    """`scenario` is a name declared by a package or `config` (serve.yaml), or a `reef.Scenario`.
    Replies are at most `max_tokens` long (default: the eval suite's `max_new_tokens`, else 64).
    `requests` chats in all, follow-up turns included. `corrections=False`: scores only, never a task's
    reference as a correction (a rewards-only scenario), and no reviewer beside an agent."""
    declared = _declared(scenario, config)
    tasks = list(training_tasks(declared))
    random.Random(seed).shuffle(tasks)
    if max_tokens is None:
        max_tokens = declared.eval.max_new_tokens if declared.eval is not None else 64
    scenario = declared.name
    headers = {"x-reef-scenario": scenario}
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", default_headers=headers, max_retries=2)
    http = httpx.AsyncClient(base_url=url, headers=headers, timeout=60.0)
    rng = random.Random(seed)
    summary = SimulationSummary(scenario)
    limit = asyncio.Semaphore(concurrency)
    agents = declared.environment is not None  # then `requests` is the number of sessions
    bar = tqdm(total=requests, desc=f"simulating {scenario}", unit="session" if agents else "chat",
               disable=not progress)
    budget = [requests]  # chats left to send, shared by all users
    try:
        model = (await client.models.list()).data[0].id
        reward = reward_for(declared, url, model)  # a judge without a url of its own asks this gateway
        environment = environment_for(declared)

        async def user(i: int) -> None:
            async with limit:
                try:
                    if environment is not None and declared.environment is not None:
                        await _one_agent(client, http, model, tasks[i % len(tasks)], reward, environment,
                                         declared.environment.max_turns, summary, temperature, max_tokens,
                                         corrections)
                    elif budget[0] > 0:
                        react = reactions if rng.random() < follow_up_share else 0
                        await _one_user(client, http, model, tasks[i % len(tasks)], reward, react, summary,
                                        temperature, max_tokens, report, budget, corrections)
                except (openai.APIError, httpx.HTTPError):
                    summary.errors += 1
                bar.update((len(summary.sessions) if agents else summary.requests) - bar.n)

        await asyncio.gather(*(user(i) for i in range(requests)))
    finally:
        bar.close()
        await client.close()
        await http.aclose()
    return summary


def simulate(url: str, scenario: str | Scenario, **kwargs: Any) -> SimulationSummary:
    """Blocking; also from a Jupyter cell, whose event loop already runs (then in a worker thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(simulate_async(url, scenario, **kwargs))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, simulate_async(url, scenario, **kwargs)).result()
