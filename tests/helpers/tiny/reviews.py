"""Short generated product reviews: the text behind the bundled `examples/reviews` scenario, and its
part of the tiny model's corpus (a contribution, see `corpus.py`).

A review names a product, says two or three things about it that are all positive or all negative,
and may add a neutral remark; the reply must be `Label: positive` or `Label: negative`. The
products are split once, by a fixed seed, into train and held-out ones: the example's eval file
only has reviews of held-out products, its task file only train ones.

The corpus teaches the labels correctly in stage "learn", then, in "calibrate", with a teacher that
says the *opposite* label most of the time (right 20%, flipped 80%): the same systematic-noise
trick as demo-add's "+1" (`add_corpus.py`). The model knows which words are positive or
negative; sampled at temperature 1 it is right about a fifth of the time, and RL only has to flip a
mapping it already has, on products it never saw rewarded.
"""

from __future__ import annotations

import random

from tests.helpers.tiny.chat_format import Chat

SYSTEM_PROMPT = "Classify the product review as positive or negative. Reply as 'Label: positive' or 'Label: negative'."
LABELS = ("positive", "negative")
PRODUCTS = (
    "blender kettle toaster lamp backpack umbrella jacket keyboard mouse headset speaker charger blanket "
    "pillow mug bottle tent chair desk clock radio camera bicycle helmet"
).split()
HELD_OUT_PRODUCTS = 6
_SPLIT_SEED = 4321  # fixed, independent of any training seed: the held-out products never move
_OPENERS = ("I bought this {p} last month.", "This {p} was a gift.", "We use the {p} every day.",
            "I ordered the {p} online.", "My {p} came on Monday.", "I got this {p} for my trip.")
_GOOD = ("It works great.", "It is very sturdy.", "It arrived quickly.", "It is easy to use.",
         "It looks beautiful.", "I love it.", "The quality is excellent.", "It was worth the price.",
         "It feels solid.", "Setup was simple.", "It does the job well.", "I would buy it again.")
_BAD = ("It broke after a week.", "It feels cheap.", "It arrived late.", "It is hard to use.",
        "It looks ugly.", "I hate it.", "The quality is poor.", "It was a waste of money.",
        "It stopped working.", "Setup was a pain.", "It does not work well.", "I want a refund.")
_NEUTRAL = ("The box was brown.", "It comes in three colors.", "My sister has one too.",
            "I read the manual.", "It fits on the shelf.", "")
TEACHER_ACCURACY = 0.2  # the rest of "calibrate" says the opposite label
COPIES_LEARN = 640
COPIES_CALIBRATE = 1280


def split_products() -> tuple[list[str], list[str]]:
    """(train products, held-out products)."""
    held = set(random.Random(_SPLIT_SEED).sample(PRODUCTS, HELD_OUT_PRODUCTS))
    return [p for p in PRODUCTS if p not in held], [p for p in PRODUCTS if p in held]


def review(rng: random.Random, product: str, label: str) -> str:
    phrases = rng.sample(_GOOD if label == "positive" else _BAD, rng.randint(2, 3))
    parts = [rng.choice(_OPENERS).format(p=product), *phrases, rng.choice(_NEUTRAL)]
    return " ".join(p for p in parts if p)


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": f"Review: {text}"}]


def format_label(label: str) -> str:
    return f"Label: {label}"


def _chats(rng: random.Random, copies: int, accuracy: float) -> list[Chat]:
    out = []
    for _ in range(copies):
        label = rng.choice(LABELS)
        said = label if rng.random() < accuracy else LABELS[1 - LABELS.index(label)]
        chat = messages(review(rng, rng.choice(PRODUCTS), label))
        out.append([*chat, {"role": "assistant", "content": format_label(said)}])
    return out


def contribution(rng: random.Random) -> dict[str, list[Chat]]:
    """Reviews of every product (held-out ones too, like demo-add's held-out pairs: what must
    generalise to them is the flip back to the right label, not the vocabulary)."""
    return {"learn": _chats(rng, COPIES_LEARN, 1.0), "calibrate": _chats(rng, COPIES_CALIBRATE, TEACHER_ACCURACY)}


def rows(products: list[str], per_label: int, seed: int, prefix: str) -> list[dict[str, object]]:
    """`per_label` distinct reviews of each label over `products`, as scenario task rows."""
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    seen: set[str] = set()
    for label in LABELS:
        n = 0
        while n < per_label:
            product = products[n % len(products)]
            text = review(rng, product, label)
            if text in seen:
                continue
            seen.add(text)
            out.append({"task_id": f"{prefix}-{len(out)}", "messages": messages(text), "label": label,
                        "product": product})
            n += 1
    random.Random(seed).shuffle(out)
    return out
