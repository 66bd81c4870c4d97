"""Write eval.jsonl and tasks.jsonl: 80 held-out tasks (items no training task asks about) and 320
training tasks, each with its own hidden price and the episode wanted as its `reference` turns.

    python examples/shop/generate.py

The price is random per task (10-99), so it is only knowable from the `price(item)` tool and a
guess almost never earns the reward. A right episode is two model turns: the call
`price({"item": "lamp"})`, then, after the tool's result (`lamp: 42`), the reply `Answer: 42`.
The `reference` turns are what a reviewer who knows the procedure corrects a failed session with
(`reef simulate` reports them as corrections on the turns that went wrong).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYSTEM_PROMPT = "You are a shop assistant. Look the price up with the tool. Reply as 'Answer: <price>'."
TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "price", "description": "The price of an item in the shop.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
}}
ITEMS = (
    "lamp mug kettle toaster chair desk clock radio camera helmet pillow blanket bottle tent jacket "
    "umbrella backpack keyboard mouse speaker charger bicycle blender headset"
).split()
HELD_OUT = 6  # items only the eval file asks about
QUESTIONS = ('How much is "{item}"?', 'What does "{item}" cost?', 'What is the price of "{item}"?',
             'How much does "{item}" cost?')


def task(task_id: str, item: str, question: str, price: int) -> dict[str, Any]:
    call = {"type": "function", "function": {"name": "price", "arguments": json.dumps({"item": item})}}
    return {"task_id": task_id, "tools": [TOOL], "item": item, "price": price,
            "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                         {"role": "user", "content": question.format(item=item)}],
            "reference": [{"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "assistant", "content": f"Answer: {price}"}]}


def rows(items: list[str], n: int, rng: random.Random, prefix: str) -> list[dict[str, Any]]:
    return [task(f"{prefix}-{k}", items[k % len(items)], rng.choice(QUESTIONS), rng.randrange(10, 100))
            for k in range(n)]


def main() -> None:
    rng = random.Random(2468)
    held = set(rng.sample(ITEMS, HELD_OUT))
    train, held_out = [i for i in ITEMS if i not in held], [i for i in ITEMS if i in held]
    files = {"eval": rows(held_out, 80, rng, "eval"), "tasks": rows(train, 320, rng, "task")}
    for name, got in files.items():
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
        print(f"{name}.jsonl: {len(got)} rows")


if __name__ == "__main__":
    main()
