"""Write eval.jsonl and tasks.jsonl: 32 held-out support messages and 256 training ones, each asking
for the order id and the customer's first name. Held-out messages use names and order numbers no
training message has (6 other names, ids 60000-99999), so a harness that copies its examples'
values shows up as a failure.

    python examples/orders/generate.py
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = ("Anna Ben Carla Dev Elif Farid Grace Hugo Ines Jonas Kai Lena Marco Nora Omar Priya Quinn Rosa Sven "
         "Tara").split()
MESSAGES = (
    "Hi, this is {n}. My order {o} has not arrived yet. Can you check?",
    "Hello, I'm {n}. I want to return the item from order {o}, it is broken.",
    "{n} here. Order {o} was charged twice, please help.",
    "Hey, order number {o} shows delivered but I got nothing. Thanks, {n}",
    "Good morning, {n} writing. Could you change the address on order {o}?",
    "Dear support, my package for order {o} is damaged. Regards, {n}",
)
QUESTION = "Message: {message}\nExtract the order id and the customer name."


def rows(names: list[str], low: int, high: int, n: int, seed: int, prefix: str) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        order = f"{rng.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}{rng.randrange(low, high)}"
        name = rng.choice(names)
        message = rng.choice(MESSAGES).format(n=name, o=order)
        out.append({"task_id": f"{prefix}-{i}", "messages": [{"role": "user", "content": QUESTION.format(message=message)}],
                    "order": order, "name": name, "reference": f"ORDER {order} | NAME {name}"})
    return out


def main() -> None:
    files = {"eval": rows(NAMES[14:], 60000, 100000, 32, seed=22, prefix="eval"),
             "tasks": rows(NAMES[:14], 10000, 60000, 256, seed=21, prefix="task")}
    for name, got in files.items():
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
        print(f"{name}.jsonl: {len(got)} rows")


if __name__ == "__main__":
    main()
