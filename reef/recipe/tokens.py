"""Training examples from recorded token ids: the model learns exactly the tokens it served, never
a re-tokenization of the recorded text (which can split differently and drifts from the served
logprobs)."""

from __future__ import annotations

import datasets
import polars as pl

IGNORE = -100


def sft_examples(samples: pl.DataFrame, max_length: int) -> datasets.Dataset:
    """`input_ids` = prompt + completion ids as served, `labels` = the completion only (prompt
    masked), cut to the first `max_length` tokens; a sample left without any label is dropped."""
    input_ids: list[list[int]] = []
    labels: list[list[int]] = []
    for prompt, completion in samples.select("prompt_ids", "completion_ids").iter_rows():
        ids = list(prompt) + list(completion)
        lab = [IGNORE] * len(prompt) + list(completion)
        input_ids.append(ids[:max_length])
        labels.append(lab[:max_length])
    keep = [i for i, lab in enumerate(labels) if any(t != IGNORE for t in lab)]
    return datasets.Dataset.from_dict(
        {
            "input_ids": [input_ids[i] for i in keep],
            "labels": [labels[i] for i in keep],
            "record_id": [samples["record_id"][i] for i in keep],
        }
    )
