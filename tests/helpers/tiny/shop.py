"""A shop assistant that must look prices up: the text behind the tiny model's old `shop` scenario
(a multi-turn tool scenario with an environment), and its part of the tiny model's corpus (a
contribution, see `corpus.py`).

The user asks what an item costs; the price is random per task, so it is only knowable from the
`price(item)` tool. A right episode is two model turns: the call
(`<tool_call>{"name": "price", "arguments": {"item": "lamp"}}</tool_call>`), then, after the tool's
result (`lamp: 4`), the answer `Answer: 4`. The scenario's environment (examples/shop/shop_environment.py)
executes the call; its reward scores the final answer.

The corpus teaches the episode correctly in stage "learn", then, in "calibrate", with a teacher that
mostly skips the tool and says it does not know (right path 35 %, "Sorry, I do not know the price
of the lamp." 65 %): the same systematic-teacher trick as demo-add's "+1" (`add_corpus.py`). The
base model knows the call and how to copy the result, but seldom calls and often garbles the item;
RL only has to make the right call the habit. The teacher never guesses a number: `Answer: ` is
only ever followed by a price copied from a tool result (a guessing teacher keeps a model this
small from learning the copy at all: it answers random prices even after the tool's result).
Items are split once, by a fixed seed, into train and held-out ones: the example's eval file only
asks about held-out items, its task file only about train ones.

What keeps it learnable for a tiny model: items quoted in the question as the call's JSON quotes
them (see QUESTIONS), one-digit prices (one token to copy), few enough items that the base model's
calls name the right one often enough for rft to start from, and a teacher on the right path often
enough that a round of traffic holds enough rewarded sessions, whatever the build's float rounding.
"""

from __future__ import annotations

import json
import random
from typing import Any

from tests.helpers.tiny.chat_format import Chat

SYSTEM_PROMPT = "You are a shop assistant. Look the price up with the tool. Reply as 'Answer: <price>'."
TOOL_NAME = "price"
TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": TOOL_NAME, "description": "The price of an item in the shop.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
}}
ITEMS = (
    "lamp mug kettle toaster chair desk clock radio camera helmet pillow blanket bottle tent jacket "
    "umbrella backpack keyboard mouse speaker charger bicycle blender headset"
).split()
HELD_OUT_ITEMS = 6
_SPLIT_SEED = 2468  # fixed, independent of any training seed: the held-out items never move
# The item is quoted as the call's JSON quotes it, so the question and the arguments tokenize alike
# (` "lamp"` -> ' "', 'lamp', '"'): the call copies tokens. Unquoted, the question's ` lamp` is one
# token and the JSON's `"lamp"` others, and the tiny model could only memorise each item's
# spelling, so its calls for items outside the traffic would fail.
QUESTIONS = ('How much is "{item}"?', 'What does "{item}" cost?', 'What is the price of "{item}"?',
             'How much does "{item}" cost?')
PRICES = range(1, 10)  # one token to copy: the tiny model does not copy longer values from a tool result reliably
TEACHER_TOOL_SHARE = 0.35  # the rest of "calibrate" does not call the tool and does not know the price
CHATS_LEARN = 800
CHATS_CALIBRATE = 800


def split_items() -> tuple[list[str], list[str]]:
    """(train items, held-out items)."""
    held = set(random.Random(_SPLIT_SEED).sample(ITEMS, HELD_OUT_ITEMS))
    return [i for i in ITEMS if i not in held], [i for i in ITEMS if i in held]


def messages(item: str, question: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": QUESTIONS[question].format(item=item)}]


def tool_result(item: str, price: int) -> str:
    return f"{item}: {price}"


def format_answer(price: int) -> str:
    return f"Answer: {price}"


def _episode(item: str, question: int, price: int, use_tool: bool) -> Chat:
    chat: Chat = messages(item, question)
    chat[0] = {**chat[0], "tools": [TOOL]}
    if not use_tool:
        return [*chat, {"role": "assistant", "content": f"Sorry, I do not know the price of the {item}."}]
    call = {"id": "call_0", "type": "function", "function": {"name": TOOL_NAME, "arguments": {"item": item}}}
    return [*chat, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": tool_result(item, price)},
            {"role": "assistant", "content": format_answer(price)}]


def _chats(rng: random.Random, n: int, tool_share: float) -> list[Chat]:
    return [_episode(rng.choice(ITEMS), rng.randrange(len(QUESTIONS)), rng.choice(PRICES), rng.random() < tool_share)
            for _ in range(n)]


def contribution(rng: random.Random) -> dict[str, list[Chat]]:
    """Every item (held-out ones too: what must generalise to them is calling the tool, not the word)."""
    return {"learn": _chats(rng, CHATS_LEARN, 1.0), "calibrate": _chats(rng, CHATS_CALIBRATE, TEACHER_TOOL_SHARE)}


def rows(items: list[str], n: int, seed: int, prefix: str) -> list[dict[str, Any]]:
    """`n` distinct tasks over `items` (each with its own hidden price), as scenario task rows."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, int, int]] = set()
    while len(out) < n:
        item, question = items[len(out) % len(items)], rng.randrange(len(QUESTIONS))
        price = rng.choice(PRICES)
        if (item, question, price) in seen:
            continue
        seen.add((item, question, price))
        out.append({"task_id": f"{prefix}-{len(out)}", "messages": messages(item, question), "tools": [TOOL],
                    "item": item, "price": price})
    return out


def as_jsonl(rows_: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows_)
