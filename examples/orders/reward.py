"""The orders scenario's reward: the reply must be exactly `ORDER <id> | NAME <first name>` (a
trailing period allowed) with the message's values. A wrong reply gets the format as feedback, the
sentence `harness_evolve`'s mined proposer turns into a rule once it recurs.
"""

FORMAT = "Reply with exactly one line: ORDER <order id> | NAME <first name>."


def reward(task, reply):
    wanted = f"ORDER {task['order']} | NAME {task['name']}"
    if (reply or "").strip().rstrip(".") == wanted:
        return 1.0, None
    return 0.0, FORMAT
