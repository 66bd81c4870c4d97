"""The reviews scenario's reward: a TRL-style batch reward function (`trl.GRPOTrainer`'s
`reward_funcs` signature), strict as an application that routes on the reply would be: the whole
reply must be `Team: <team>` (a trailing period allowed) naming the complaint's team.
"""

import re

_REPLY = re.compile(r"^\s*Team:\s*(delivery|quality|setup|billing)\s*\.?\s*$")


def reward(prompts, completions, team, **kwargs):
    scores = []
    for completion, want in zip(completions, team, strict=True):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        match = _REPLY.match(text or "")
        scores.append(1.0 if match and match.group(1) == want else 0.0)
    return scores
