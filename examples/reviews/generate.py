"""Write eval.jsonl and tasks.jsonl: 80 held-out reviews (of products no task mentions) and 320
training reviews, each a complaint that belongs to one of four teams, with the reply wanted as its
`reference`.

    python examples/reviews/generate.py

A review names a product, says one or two things that went wrong (all of one kind: delivery, the
product's quality, setting it up, or billing) and may add a remark that says nothing. The reply
must be `Team: delivery|quality|setup|billing`. Products are split once, by a fixed seed: the eval
file has only reviews of held-out products, the task file only of the others.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYSTEM_PROMPT = ("Route the customer's complaint to the team that handles it: delivery, quality, setup or billing. "
                 "Reply as 'Team: <team>'.")
PRODUCTS = (
    "blender kettle toaster lamp backpack umbrella jacket keyboard mouse headset speaker charger blanket "
    "pillow mug bottle tent chair desk clock radio camera bicycle helmet"
).split()
HELD_OUT = 6
OPENERS = ("I bought this {p} last month.", "This {p} was a gift.", "We ordered the {p} online.",
           "My {p} came on Monday.", "I got this {p} for my trip.", "About the {p} I ordered.")
PROBLEMS = {
    "delivery": ("It arrived two weeks late.", "The box was crushed in transit.", "The courier left it in the rain.",
                 "It was delivered to the wrong address.", "The parcel never showed up.", "Tracking has not moved."),
    "quality": ("It broke after a week.", "It feels cheap.", "The handle snapped.", "It stopped working.",
                "The paint is peeling off.", "A part is cracked."),
    "setup": ("The manual makes no sense.", "I cannot get it to turn on.", "Setup was a pain.",
              "The buttons are confusing.", "The app will not pair with it.", "Assembly took me hours."),
    "billing": ("I was charged twice.", "The refund never came.", "The price at checkout was higher.",
                "My coupon was not applied.", "I got an invoice for the wrong amount.", "They billed my old card."),
}
REMARKS = ("The color is nice.", "My sister has one too.", "It fits on the shelf.", "", "")


def review(rng: random.Random, product: str, team: str) -> str:
    parts = [rng.choice(OPENERS).format(p=product), *rng.sample(PROBLEMS[team], rng.randint(1, 2)), rng.choice(REMARKS)]
    return " ".join(p for p in parts if p)


def rows(products: list[str], per_team: int, rng: random.Random, prefix: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for team in PROBLEMS:
        n = 0
        while n < per_team:
            product = products[n % len(products)]
            text = review(rng, product, team)
            if text in seen:
                continue
            seen.add(text)
            out.append({"task_id": f"{prefix}-{len(out)}", "team": team, "product": product,
                        "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                                     {"role": "user", "content": f"Complaint: {text}"}],
                        "reference": f"Team: {team}"})
            n += 1
    rng.shuffle(out)
    return out


def main() -> None:
    rng = random.Random(4321)
    held = set(rng.sample(PRODUCTS, HELD_OUT))
    train, held_out = [p for p in PRODUCTS if p not in held], [p for p in PRODUCTS if p in held]
    files = {"eval": rows(held_out, 20, rng, "eval"), "tasks": rows(train, 80, rng, "task")}
    for name, got in files.items():
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
        print(f"{name}.jsonl: {len(got)} rows")


if __name__ == "__main__":
    main()
