"""Offline traffic for any scenario: a model answers the scenario's training prompts (`tasks:`) with
plain transformers sampling (reef.sampling.transformers), recorded exactly as the gateway records
served chats (prompt and completion token ids, the model's per-token logprobs, a `task_id` tag) and
scored by the scenario's reward as reports (a reply the reward cannot score gets no report).

It lets the learning pipeline run from a fresh clone without a running server (the DVC
`demo-traffic` stage) and gives tests and notebooks realistic experience. Logprobs are the
untempered model's (what vLLM reports by default, `logprobs_mode=raw_logprobs`).

    python -m reef.traffic.offline -c examples/sentiment/serve.yaml --scenario sentiment --data-dir data/demo-traffic
"""

from __future__ import annotations

import argparse
import json
import random
import uuid
from datetime import datetime
from pathlib import Path

import torch

from reef.config import DEFAULT_MODEL, ServeConfig, StoreConfig, resolve
from reef.core.clock import utcnow
from reef.core.hashing import sha256_json
from reef.experience import ExperienceStore
from reef.experience.schema import Choice, Message, Record, Report, Tag, record_content_hash
from reef.sampling.completion import Completion
from reef.sampling.load import load_model
from reef.sampling.transformers import TransformersSampler
from reef.scenario import Scenario, Task, correction, get_scenario, reward_for, training_tasks


def to_record(task: Task, s: Completion, record_id: str, scenario: str, release: str, created_at: datetime) -> Record:
    messages = [Message(role=m["role"], content=m.get("content")) for m in task["messages"]]
    choices = [Choice(index=0, content=s.text, finish_reason=s.finish_reason, token_ids=s.completion_ids,
                      logprobs=s.logprobs or [])]
    body = {"model": "reef-tiny", "messages": task["messages"], "temperature": 1.0}
    response = {"id": f"chatcmpl-{record_id}", "object": "chat.completion", "model": "reef-tiny",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": s.text},
                             "finish_reason": s.finish_reason}]}
    tags = [Tag(name="task_id", value=str(task["task_id"]))] if "task_id" in task else []
    return Record(
        record_id=record_id, scenario=scenario, session_id=f"sess-{record_id}", created_at=created_at,
        request_model="reef-tiny", response_model="reef-tiny", response_id=response["id"], release_id=release,
        messages=messages, temperature=1.0, params_json=json.dumps({"temperature": 1.0}), choices=choices,
        finish_reasons=[s.finish_reason], prompt_token_ids=s.prompt_ids, input_tokens=len(s.prompt_ids),
        output_tokens=len(s.completion_ids), tags=tags,
        content_hash=record_content_hash(scenario, messages, choices), body_hash=sha256_json(body),
        request_json=json.dumps(body), response_json=json.dumps(response),
    )


def record_offline_traffic(
    model_dir: Path | str, data_dir: Path | str, scenario: str | Scenario, *, prompts: int = 64, samples: int = 4,
    seed: int = 0, release: str | None = None, temperature: float = 1.0, max_new_tokens: int | None = None,
    config: ServeConfig | None = None,
) -> dict[str, float]:
    """Sample `samples` replies to each of `prompts` of the scenario's training prompts (shuffled by
    `seed`), store records + reports under `data_dir`; returns {records, reports, mean_score}.
    `scenario` is a name declared by a package or `config` (serve.yaml), or a `reef.Scenario`."""
    declared = scenario if isinstance(scenario, Scenario) else get_scenario(scenario, config)
    tasks = list(training_tasks(declared))
    random.Random(seed).shuffle(tasks)
    tasks = tasks[:prompts]
    reward = reward_for(declared)
    if max_new_tokens is None:
        max_new_tokens = declared.eval.max_new_tokens if declared.eval is not None else 64
    name = declared.name
    release = release or f"{name}@r0"
    rng = random.Random(seed)
    model, tokenizer = load_model(model_dir)
    groups = TransformersSampler(model, tokenizer, logprobs=True).sample(
        [t["messages"] for t in tasks], samples, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
        tools=[t.get("tools") for t in tasks])
    sampled = [(task, c) for task, group in zip(tasks, groups, strict=True) for c in group]
    scores = reward([task for task, _ in sampled], [c.text for _, c in sampled])
    records, reports = [], []
    for (task, completion), score in zip(sampled, scores, strict=True):
        record_id = f"rec_{uuid.UUID(int=rng.getrandbits(128)).hex}"
        now = utcnow()
        records.append(to_record(task, completion, record_id, name, release, now))
        if score.value is None:
            continue
        metadata = {"task_id": task["task_id"]} if "task_id" in task else {}
        reports.append(Report(report_id=f"rep_{record_id[4:]}", scenario=name, record_ids=[record_id],
                              score=score.value, feedback=score.feedback,
                              correction=correction(task, score.value, 0.5), metadata_json=json.dumps(metadata),
                              created_at=now, content_hash=sha256_json([record_id, score.value])))
    with ExperienceStore(data_dir, StoreConfig(fsync=False)) as store:
        store.append_records_sync(records)
        store.append_reports_sync(reports)
    return {"records": len(records), "reports": len(reports),
            "mean_score": sum(r.score for r in reports) / max(1, len(reports))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", required=True, help="a scenario declared by a package or serve.yaml")
    parser.add_argument("-c", "--config", type=Path, help="serve.yaml declaring the scenario (default: ./serve.yaml)")
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--data-dir", default="data/demo-traffic")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    config, _ = resolve(config_file=args.config)
    print(record_offline_traffic(args.model, args.data_dir, args.scenario, prompts=args.prompts, samples=args.samples,
                                 seed=args.seed, config=config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
