"""What evaluation is made of: a scenario's eval suite, the mean of scored replies, and the one
transformers model loader and generate helper (the gate's offline path, recipes, notebooks, tests).

The evaluator itself is the gate (reef.gate.evaluate): a candidate vs. a baseline, paired per task,
through the serving engine or through these helpers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from reef.core.paths import CANDIDATE_FILE
from reef.scenario import Environment, EpisodeState, EvalSuite, Scenario, Score, eval_suite, get_scenario
from reef.scenario.environment import parse_reply


def declared_scenario(scenario: str) -> Scenario:
    """A scenario as installed packages and ./serve.yaml declare it."""
    from reef.config import resolve

    config, _ = resolve()  # serve.yaml in the working folder, if any, declares scenarios too
    return get_scenario(scenario, config)


def suite_for(scenario: str, engine_url: str | None = None, engine_model: str | None = None) -> EvalSuite:
    """The declared eval suite of a scenario (see reef.scenario); ScenarioError when it has none."""
    return eval_suite(declared_scenario(scenario), engine_url, engine_model)


def mean_score(scores: Sequence[Score]) -> float | None:
    """Mean of the scored replies; a reply the reward could not score is left out (None when none was)."""
    values = [s.value for s in scores if s.value is not None]
    return sum(values) / len(values) if values else None


def load_model(path: Path | str, adapter: Path | str | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A model folder (with a LoRA `adapter` merged in), or a recipe's candidate folder (a LoRA
    candidate is merged into the base model its candidate.json names). fp32, in eval mode."""
    path = Path(path)
    meta = json.loads((path / CANDIDATE_FILE).read_text()) if (path / CANDIDATE_FILE).is_file() else {}
    if adapter is None and meta.get("kind") == "lora":
        path, adapter = Path(meta["lineage"]["base_model"]), path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return model.eval(), AutoTokenizer.from_pretrained(path)


@torch.no_grad()
def replies(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[list[dict[str, Any]]], *,
            samples: int, temperature: float, seed: int, max_new_tokens: int = 16, batch_size: int = 32,
            tools: Sequence[list[dict[str, Any]] | None] | None = None) -> list[list[str]]:
    """`samples` replies per conversation with transformers `generate` (temperature 0: greedy). No
    top-k/top-p, so temperature 1 samples the model's own distribution, as vLLM does when asked
    so. `tools[i]` (the task's tool definitions) is rendered into conversation i's chat template."""
    torch.manual_seed(seed)
    out: list[list[str]] = []
    for start in range(0, len(prompts), batch_size):
        ids = [tokenizer.encode(tokenizer.apply_chat_template(p, tools=tools[start + k] if tools else None,
                                                              add_generation_prompt=True, tokenize=False),
                                add_special_tokens=False) for k, p in enumerate(prompts[start : start + batch_size])]
        width = max(map(len, ids))
        pad = tokenizer.pad_token_id
        gen = model.generate(
            input_ids=torch.tensor([[pad] * (width - len(i)) + i for i in ids]),
            attention_mask=torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids]),
            max_new_tokens=max_new_tokens, do_sample=temperature > 0, num_return_sequences=samples,
            temperature=temperature if temperature > 0 else None, top_k=0 if temperature > 0 else None,
            top_p=1.0 if temperature > 0 else None, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
        )
        texts = tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
        out += [texts[i : i + samples] for i in range(0, len(texts), samples)]
    return out


def episode_replies(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tasks: Sequence[dict[str, Any]],
                    environment: Environment, max_turns: int, *, samples: int, temperature: float, seed: int,
                    max_new_tokens: int = 16, batch_size: int = 32) -> list[list[str]]:
    """`samples` episodes per task (model -> tool calls executed by `environment` -> model ...) with
    `replies`, every unfinished episode of a turn in one batch; each episode's final reply text."""
    states = [[EpisodeState(task, environment, max_turns) for _ in range(samples)] for task in tasks]
    flat = [state for group in states for state in group]
    turn = 0
    while active := [state for state in flat if not state.done]:
        texts = replies(model, tokenizer, [s.messages for s in active], samples=1, temperature=temperature,
                        seed=seed + turn, max_new_tokens=max_new_tokens, batch_size=batch_size,
                        tools=[s.task.get("tools") for s in active])
        for state, (text,) in zip(active, texts, strict=True):
            state.advance(parse_reply(text))
        turn += 1
    return [[state.reply or "" for state in group] for group in states]
