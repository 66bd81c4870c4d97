"""The sentiment scenario's reward: a TRL-style batch reward function (`trl.GRPOTrainer`'s
`reward_funcs` signature), strict on purpose: the whole reply must be `Label: positive` or
`Label: negative` (a trailing period allowed) and name the review's label. A sentence that happens
to contain the right word earns nothing, as an application that parses the reply would see it.
"""

import re

_REPLY = re.compile(r"^\s*Label:\s*(positive|negative)\s*\.?\s*$")


def reward(prompts, completions, label, **kwargs):
    scores = []
    for completion, want in zip(completions, label):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        match = _REPLY.match(text or "")
        scores.append(1.0 if match and match.group(1) == want else 0.0)
    return scores
