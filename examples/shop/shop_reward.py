"""The shop scenario's reward: a per-task verifier of the episode's final answer.

The price is only in the tool's result, so a reply that did not call the tool can only guess it.
"""

import re

_ANSWER = re.compile(r"Answer:\s*(\d+)")


def reward(task, reply):
    """1.0 when the final reply's first `Answer: N` is the item's price, else 0.0."""
    match = _ANSWER.search(reply or "")
    return 1.0 if match and int(match.group(1)) == task["price"] else 0.0
