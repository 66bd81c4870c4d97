"""Helpers for the release tests: quick candidates, and client threads that keep the gateway busy."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from reef.recipe import Candidate, Snapshot, load_recipe
from reef.sampling.load import load_model
from reef.sampling.transformers import TransformersSampler
from reef.traffic.offline import record_offline_traffic
from tests.helpers.tiny import task as demo


def train_candidates(tiny: Path, work: Path, specs: dict[str, dict[str, Any]]) -> dict[str, Candidate]:
    """rft candidates from one snapshot of offline demo traffic, e.g. {"lora": {"kind": "lora", ...}}."""
    record_offline_traffic(tiny, work / "traffic", "demo-add", prompts=64, samples=4, seed=1)
    out = {}
    for name, params in specs.items():
        rft = load_recipe("rft", {"scenario": demo.SCENARIO, "base_model": str(tiny), "per_device_batch_size": 16,
                                  "min_score": 1.0, **params})
        snap = Snapshot.create(demo.SCENARIO, work / "traffic", rft.experience(), root=work / "snapshots",
                               ledger_root=work / "ledger")
        out[name] = rft.run(snap, out_root=work / "candidates" / name, progress=False, consume=False)
    return out


def greedy(model_dir: Path, prompts: list[list[dict[str, str]]], max_tokens: int = 8) -> list[str]:
    """What a model folder or candidate answers at temperature 0 (transformers, fp32)."""
    model, tokenizer = load_model(model_dir)
    return [r[0].text for r in TransformersSampler(model, tokenizer).sample(prompts, 1, max_new_tokens=max_tokens,
                                                                            temperature=0.0, seed=0)]


@dataclass
class Outcome:
    record_id: str | None
    text: str | None
    error: str | None
    stream: bool


@dataclass
class Load:
    """`clients` threads asking `messages` at temperature 0 until stopped, half of them streaming
    (`streams`); client i sends `x-reef-session: sessions[i % len(sessions)]` when `sessions` are given
    (to spread the load over replicas)."""

    url: str
    model: str
    scenario: str
    messages: list[dict[str, str]]
    clients: int = 8
    sessions: tuple[str, ...] = ()
    streams: bool = True
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for i in range(self.clients):
            t = threading.Thread(target=self._run, args=(self.streams and i % 2 == 0, i), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def _run(self, stream: bool, i: int) -> None:
        headers = {"x-reef-scenario": self.scenario}
        if self.sessions:
            headers["x-reef-session"] = self.sessions[i % len(self.sessions)]
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120,
                               default_headers=headers)
        while not self._stop.is_set():
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model=self.model, messages=self.messages, temperature=0, max_tokens=8, stream=stream)
                record_id = raw.headers.get("x-reef-agent-record-id")
                if stream:
                    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
                else:
                    text = raw.parse().choices[0].message.content
                self.outcomes.append(Outcome(record_id, text, None, stream))
            except Exception as exc:  # noqa: BLE001 - every failure is counted, none may happen
                self.outcomes.append(Outcome(None, None, repr(exc), stream))
            time.sleep(0.01)

    def wait_for_more(self, n: int, timeout_s: float = 120.0) -> None:
        """Until `n` more requests than now have finished: with `n` >= 2 x clients, at least `clients`
        of them were sent after this call (each client has at most one request in flight)."""
        target = len(self.outcomes) + n
        deadline = time.monotonic() + timeout_s
        while len(self.outcomes) < target:
            assert time.monotonic() < deadline, f"{len(self.outcomes)} of {target} requests finished"
            time.sleep(0.05)

    def errors(self) -> list[str]:
        return [o.error for o in self.outcomes if o.error]
