"""Training examples from recorded token ids: the model learns exactly the tokens it served, never
a re-tokenization of the recorded text (which can split differently and drifts from the served
logprobs).

(The exceptions: a report's `correction`, text or an assistant message that was never served, see
`with_corrections`; and a tool call sampled under guided decoding, whose served tokens are the JSON
the grammar forced, not what the model writes unconstrained. Both are rendered by one function,
`assistant_turn_ids`.)

Too long for `max_length`: the prompt is cut from the LEFT, so the completion (what is trained)
and the context right before it stay whole. Only a completion longer than `max_length` by itself
loses its end; `CutStats` counts both cases for candidate.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import datasets
import polars as pl

from reef.experience.schema import correction_message

IGNORE = -100


@dataclass
class CutStats:
    """How many examples `fit_left` had to shorten, and how."""

    prompts_cut: int = 0  # prompt cut from the left, completion whole
    completions_cut: int = 0  # the completion alone was too long: its end is lost

    def add(self, prompt_cut: bool, completion_cut: bool) -> None:
        self.prompts_cut += prompt_cut
        self.completions_cut += completion_cut

    def as_metrics(self) -> dict[str, int]:
        return {"truncated_prompts": self.prompts_cut, "truncated_completions": self.completions_cut}


def fit_left(prompt: list[int], completion: list[int], max_length: int) -> tuple[int, int, bool, bool]:
    """How much of a prompt + completion fits in `max_length`: returns (prompt tokens dropped from
    its start, completion tokens kept from its start, prompt cut?, completion cut?). One prompt
    token is kept even when the completion fills the window: the first completion token's label
    sits on the position before it."""
    if len(prompt) + len(completion) <= max_length:
        return 0, len(completion), False, False
    keep_prompt = max(min(len(prompt), 1), max_length - len(completion))
    keep_completion = min(len(completion), max_length - keep_prompt)
    return len(prompt) - keep_prompt, keep_completion, True, keep_completion < len(completion)


def with_corrections(samples: pl.DataFrame, tokenizer: Any, min_score: float | None) -> tuple[pl.DataFrame, int]:
    """`Snapshot.samples()` to imitate: the replies scored at least `min_score` as served, and for a
    record scored below it whose report carries a `correction`, that correction instead (once per
    record, tokenized after the recorded prompt and closed with the tokenizer's end-of-turn token, so
    the model learns to stop). The one place Reef tokenizes text to train on: a correction was
    never served, so it has no served ids. Returns (samples, how many are corrections)."""
    passed = pl.col("score") >= min_score if min_score is not None else pl.lit(True)
    kept = samples.filter(passed.fill_null(False) | pl.col("correction").is_null())
    fixes = samples.filter(~passed.fill_null(False) & pl.col("correction").is_not_null()).unique(
        "record_id", keep="first", maintain_order=True)
    if fixes.is_empty():
        return kept, 0
    ids = [correction_ids(tokenizer, text) for text in fixes["correction"]]
    fixes = fixes.with_columns(completion_ids=pl.Series(ids, dtype=samples.schema["completion_ids"]),
                               text=pl.col("correction"))
    return pl.concat([kept, fixes.select(kept.columns)]), fixes.height


def correction_ids(tokenizer: Any, correction: str) -> list[int]:
    """The token ids of a correction as the model would have served it, ending with its
    end-of-turn token: text as tokenized, an assistant message (a corrected tool call, see
    `correction_message`) as the chat template renders that turn (`assistant_turn_ids`), so a
    tool call is learned in exactly the markup the engine's tool parser reads. The turn is rendered
    after a stand-in user message: a template writes an assistant turn the same after any prompt."""
    end = tokenizer.eos_token_id
    message = correction_message(correction)
    if message is None:
        ids = list(tokenizer(correction, add_special_tokens=False)["input_ids"])
    else:
        ids = assistant_turn_ids(tokenizer, [{"role": "user", "content": "-"}], message)
    return ids if end is None or ids[-1:] == [end] else [*ids, end]


def assistant_turn_ids(tokenizer: Any, messages: list[dict[str, Any]], reply: dict[str, Any],
                       tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The ids the chat template gives the assistant turn `reply` (content and `tool_calls`) after
    `messages`: what follows the generation prompt, up to and including the end-of-turn token.

    For a reply whose served tokens are not what the model should learn to write: a tool call that
    vLLM's guided decoding (`tool_choice: "required"`) produced as bare JSON is trained as the markup
    the template writes for that call (`<tool_call>...</tool_call>`), the form the tool-call parser
    reads from an unconstrained reply. ValueError when the template renders the conversation's start
    differently once the turn is added (the prompt ids would not be a prefix)."""
    turn = {"role": "assistant", "content": reply.get("content") or ""}
    if reply.get("tool_calls"):
        turn["tool_calls"] = [_template_call(call) for call in reply["tool_calls"]]
    prompt = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template([*messages, turn], tools=tools, tokenize=False, add_generation_prompt=False)
    if not full.startswith(prompt):
        raise ValueError("the chat template renders the conversation differently once the assistant turn is added")
    rest = full[len(prompt):]
    eos = tokenizer.eos_token
    if eos and eos in rest:  # the turn ends at its end token; what follows belongs to the next turn
        rest = rest[: rest.index(eos) + len(eos)]
    return list(tokenizer.encode(rest, add_special_tokens=False))


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call with its `arguments` decoded: templates write a dict as JSON, and would
    write the string vLLM sends as a quoted string."""
    fn = dict(call.get("function") or {})
    arguments = fn.get("arguments")
    if isinstance(arguments, str):
        try:
            fn["arguments"] = json.loads(arguments or "{}")
        except ValueError:
            pass  # not JSON: the template writes it as it is
    return {"type": "function", "function": fn, **({"id": call["id"]} if call.get("id") else {})}


def sft_examples(samples: pl.DataFrame, max_length: int, stats: CutStats | None = None) -> datasets.Dataset:
    """`input_ids` = prompt + completion ids as served, `labels` = the completion only (prompt
    masked), cut to `max_length` from the left (see `fit_left`; `stats` counts the cuts); a sample
    left without any label is dropped."""
    stats = stats if stats is not None else CutStats()
    input_ids: list[list[int]] = []
    labels: list[list[int]] = []
    for prompt, completion in samples.select("prompt_ids", "completion_ids").iter_rows():
        prompt, completion = list(prompt), list(completion)
        drop, keep, prompt_cut, completion_cut = fit_left(prompt, completion, max_length)
        stats.add(prompt_cut, completion_cut)
        prompt, completion = prompt[drop:], completion[:keep]
        input_ids.append(prompt + completion)
        labels.append([IGNORE] * len(prompt) + completion)
    keep_rows = [i for i, lab in enumerate(labels) if any(t != IGNORE for t in lab)]
    return datasets.Dataset.from_dict(
        {
            "input_ids": [input_ids[i] for i in keep_rows],
            "labels": [labels[i] for i in keep_rows],
            "record_id": [samples["record_id"][i] for i in keep_rows],
        }
    )


def trajectory_examples(trajectories: pl.DataFrame, max_length: int, stats: CutStats | None = None) -> datasets.Dataset:
    """Whole sessions (`Snapshot.trajectories()`): `input_ids` every turn's served tokens, `labels`
    the model's own tokens of every assistant turn (user turns, tool results and template tokens
    masked). Too long: cut from the left like `sft_examples`, so the last turns stay whole (`stats`
    counts cut trajectories as cut prompts); a trajectory left without any label is dropped."""
    stats = stats if stats is not None else CutStats()
    input_ids, labels, sessions = [], [], []
    for session, ids, lab in trajectories.select("session_id", "input_ids", "labels").iter_rows():
        drop = max(0, len(ids) - max_length)
        stats.add(drop > 0, False)
        lab = list(lab)[drop:]
        if any(t != IGNORE for t in lab):
            input_ids.append(list(ids)[drop:])
            labels.append(lab)
            sessions.append(session)
    return datasets.Dataset.from_dict({"input_ids": input_ids, "labels": labels, "session_id": sessions})
