"""Offline traffic for any scenario: a model answers the scenario's training prompts (`tasks:`) with
plain transformers sampling, recorded exactly as the gateway records served chats (prompt and
completion token ids, the model's per-token logprobs, a `task_id` tag) and scored by the
scenario's reward as reports (a reply the reward cannot score gets no report).

It lets the learning pipeline run from a fresh clone without a running server (the DVC
`demo-traffic` stage) and gives tests and notebooks realistic experience. Logprobs are the
untempered model's (what vLLM reports by default, `logprobs_mode=raw_logprobs`).

    python -m reef.traffic.offline --scenario demo-add --model data/models/tiny --data-dir data/demo-traffic
"""

from __future__ import annotations

import argparse
import json
import random
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reef.config import ServeConfig, StoreConfig, resolve
from reef.experience import ExperienceStore
from reef.experience.schema import Choice, Message, Record, Report, Tag, record_content_hash, sha256_json, utcnow
from reef.scenario import Scenario, Task, get_scenario, reward_for, training_tasks


@dataclass(frozen=True)
class Sampled:
    task: Task
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str


@torch.no_grad()
def sample(model_dir: Path | str, tasks: list[Task], samples: int, *, temperature: float = 1.0,
           max_new_tokens: int = 12, seed: int = 0) -> list[Sampled]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = tokenizer.eos_token_id
    torch.manual_seed(seed)
    out: list[Sampled] = []
    for start in range(0, len(tasks), 32):
        batch = tasks[start : start + 32]
        # Rendered then tokenized without extra special tokens: what vLLM does for a chat request.
        prompts = [tokenizer.encode(tokenizer.apply_chat_template(t["messages"], add_generation_prompt=True,
                                                                  tools=t.get("tools"), tokenize=False),
                                    add_special_tokens=False)
                   for t in batch]
        width = max(map(len, prompts))
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        gen = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=True,
            temperature=temperature, top_k=0, top_p=1.0, num_return_sequences=samples,
            output_logits=True, return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos,
        )
        new = gen.sequences[:, width:]
        logprobs = torch.stack(gen.logits, dim=1).float().log_softmax(-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        for row in range(new.shape[0]):
            toks = new[row].tolist()
            n = toks.index(eos) + 1 if eos in toks else len(toks)
            task = batch[row // samples]
            out.append(Sampled(task, prompts[row // samples], toks[:n], logprobs[row, :n].tolist(),
                               tokenizer.decode(toks[:n], skip_special_tokens=True),
                               "stop" if eos in toks[:n] else "length"))
    return out


def to_record(s: Sampled, record_id: str, scenario: str, release: str, created_at: datetime) -> Record:
    messages = [Message(role=m["role"], content=m.get("content")) for m in s.task["messages"]]
    choices = [Choice(index=0, content=s.text, finish_reason=s.finish_reason, token_ids=s.completion_ids,
                      logprobs=s.logprobs)]
    body = {"model": "reef-tiny", "messages": s.task["messages"], "temperature": 1.0}
    response = {"id": f"chatcmpl-{record_id}", "object": "chat.completion", "model": "reef-tiny",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": s.text},
                             "finish_reason": s.finish_reason}]}
    tags = [Tag(name="task_id", value=str(s.task["task_id"]))] if "task_id" in s.task else []
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
    sampled = sample(model_dir, tasks, samples, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    scores = reward([s.task for s in sampled], [s.text for s in sampled])
    records, reports = [], []
    for s, score in zip(sampled, scores, strict=True):
        record_id = f"rec_{uuid.UUID(int=rng.getrandbits(128)).hex}"
        now = utcnow()
        records.append(to_record(s, record_id, name, release, now))
        if score.value is None:
            continue
        metadata = {"task_id": s.task["task_id"]} if "task_id" in s.task else {}
        reports.append(Report(report_id=f"rep_{record_id[4:]}", scenario=name, record_ids=[record_id],
                              score=score.value, feedback=score.feedback, metadata_json=json.dumps(metadata),
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
    parser.add_argument("--model", default="data/models/tiny")
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
