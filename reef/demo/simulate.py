"""`reef simulate`: plays the demo task's users against a running gateway.

Each simulated user asks a train prompt through the real OpenAI SDK, scores the reply with the
task's verifier and reports the score on `/reef/report`. Some users ask a follow-up turn without
a session header, which the gateway must stitch into the first turn's session.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

import httpx
import openai
from tqdm.auto import tqdm

from reef.demo.task import SCENARIO, Task, score, train_tasks

FOLLOW_UP = "Are you sure? Check it and answer again."


@dataclass
class SimulationSummary:
    scenario: str
    requests: int = 0
    reports: int = 0
    errors: int = 0
    scores: list[float] = field(default_factory=list)
    sessions: dict[str, list[str]] = field(default_factory=dict)  # first record id -> record ids

    @property
    def mean_score(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0

    def histogram(self) -> Counter[float]:
        return Counter(round(s, 2) for s in self.scores)

    def render(self) -> str:
        lines = [f"scenario {self.scenario}: {self.requests} chats, {self.reports} reports, "
                 f"{self.errors} errors, mean score {self.mean_score:.3f}"]
        hist = self.histogram()
        width = max(hist.values(), default=1)
        for value in sorted(hist):
            lines.append(f"  score {value:4.2f} {'#' * max(1, 40 * hist[value] // width)} {hist[value]}")
        return "\n".join(lines)


async def _one_user(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, model: str, task: Task, follow_up: bool,
    summary: SimulationSummary, temperature: float,
) -> None:
    messages: list[dict[str, str]] = list(task.messages)
    record_ids = []
    for turn in range(2 if follow_up else 1):
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=16, temperature=temperature,  # type: ignore[arg-type]
        )
        completion = raw.parse()
        record_id = raw.headers["x-reef-agent-record-id"]
        reply = completion.choices[0].message.content or ""
        reward = score(task, reply)
        resp = await http.post("/reef/report", json={"agent_record_id": record_id, "score": reward,
                                                     "metadata": {"task_id": task.task_id, "turn": turn}})
        resp.raise_for_status()
        summary.requests += 1
        summary.reports += 1
        summary.scores.append(reward)
        record_ids.append(record_id)
        messages = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": FOLLOW_UP}]
    summary.sessions[record_ids[0]] = record_ids


async def simulate_async(
    url: str, scenario: str = SCENARIO, requests: int = 200, concurrency: int = 8, seed: int = 0,
    follow_up_share: float = 0.2, temperature: float = 1.0, progress: bool = True,
) -> SimulationSummary:
    headers = {"x-reef-scenario": scenario}
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", default_headers=headers, max_retries=2)
    http = httpx.AsyncClient(base_url=url, headers=headers, timeout=60.0)
    model = (await client.models.list()).data[0].id
    rng = random.Random(seed)
    tasks = train_tasks(seed)
    summary = SimulationSummary(scenario)
    limit = asyncio.Semaphore(concurrency)
    bar = tqdm(total=requests, desc=f"simulating {scenario}", unit="chat", disable=not progress)

    async def user(i: int) -> None:
        async with limit:
            try:
                await _one_user(client, http, model, tasks[i % len(tasks)], rng.random() < follow_up_share,
                                summary, temperature)
            except (openai.APIError, httpx.HTTPError):
                summary.errors += 1
            bar.update(summary.requests - bar.n)

    users = 0
    while users * (1 + follow_up_share) < requests:
        users += 1
    try:
        await asyncio.gather(*(user(i) for i in range(users)))
    finally:
        bar.close()
        await client.close()
        await http.aclose()
    return summary


def simulate(url: str, **kwargs: object) -> SimulationSummary:
    """Blocking; also from a Jupyter cell, whose event loop already runs (then in a worker thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(simulate_async(url, **kwargs))  # type: ignore[arg-type]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, simulate_async(url, **kwargs)).result()  # type: ignore[arg-type]
