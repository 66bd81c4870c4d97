"""The reviews scenario's reward: a TRL-style batch reward function, the `reward_funcs` signature of
`trl.GRPOTrainer`, so the same function works in a TRL script and in Reef unchanged.

Reef calls it with conversational prompts and completions and every other field of the task rows
as a keyword column (here `label`, and `task_id`/`product`, which it ignores).
"""

import re

_LABEL = re.compile(r"Label:\s*(positive|negative)\b", re.IGNORECASE)


def reward(prompts, completions, label, **kwargs):
    """1.0 when the first `Label: ...` in the reply is the review's label, else 0.0."""
    scores = []
    for completion, want in zip(completions, label):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        match = _LABEL.search(text or "")
        scores.append(1.0 if match and match.group(1).lower() == want else 0.0)
    return scores
