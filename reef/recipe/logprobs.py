"""Per-token log-probabilities of a batch's completion tokens, for the RL losses (online_rl,
ttt, self_play), without materialising the vocabulary's log_softmax.

Two things keep memory to what the loss needs: the model computes logits only from the first
completion position of the batch on (`logits_to_keep`), so a long prompt costs no vocabulary-
sized row per token; and TRL's `selective_log_softmax` gathers the chosen token's logit and
subtracts a row-wise logsumexp, never writing a second (batch, tokens, vocabulary) tensor (a full
log_softmax over a 150k vocabulary at 1k tokens and batch 16 is about 10 GB in fp32).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[targets] per position (TRL's memory-efficient version of it)."""
    from trl.trainer.utils import selective_log_softmax  # imported here: importing trl takes seconds

    return selective_log_softmax(logits, targets)


def completion_logprobs(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        completion_mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """log pi(input_ids[:, t]) for t >= `start`, where `start` is the batch's first completion
    position (right-padded rows); returns them and `start`, so callers slice their per-position
    tensors (masks, behaviour logprobs) as `x[:, start:]`."""
    has = completion_mask.bool().any(0)
    start = max(1, int(has.float().argmax())) if bool(has.any()) else input_ids.shape[1] - 1
    # Logits at positions start-1 .. T-1: the last one predicts nothing and is dropped.
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   logits_to_keep=input_ids.shape[1] - start + 1).logits[:, :-1]
    return token_logprobs(logits, input_ids[:, start:]), start
