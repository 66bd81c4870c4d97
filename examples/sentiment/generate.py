"""Write eval.jsonl and tasks.jsonl: 48 held-out reviews (of 12 products no task mentions) and 256
training reviews (of 28 other products), half positive, half negative.

    python examples/sentiment/generate.py

Each row is a task as Reef reads it: `messages` (what a user sends), `label` (what the reward
checks) and `reference`, the reply wanted (what a user who rejects a reply sends back as its
correction). The text is made here from short templates; a scenario of your own brings its own rows.
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
POSITIVE = ("great excellent wonderful fantastic amazing perfect lovely superb reliable sturdy comfortable "
            "brilliant solid delightful impressive handy").split()
NEGATIVE = ("terrible awful broken useless flimsy disappointing horrible cheap faulty noisy uncomfortable "
            "defective poor annoying worthless leaky").split()
TAILS = {
    "positive": ("I love it.", "Would buy again.", "Highly recommend.", "Five stars.", "Very happy with it.",
                 "Works like a charm.", "Best purchase this year.", "My family loves it too."),
    "negative": ("I want a refund.", "Would not buy again.", "Do not recommend.", "One star.",
                 "Very unhappy with it.", "It stopped working after a day.", "Waste of money.",
                 "Returning it tomorrow."),
}
PRODUCTS = ("kettle toaster blender lamp backpack umbrella keyboard mouse headphones speaker charger phone-case "
            "water-bottle desk-chair jacket boots frying-pan coffee-maker vacuum hair-dryer monitor tent "
            "sleeping-bag yoga-mat watch wallet suitcase drill printer router bike-lock rice-cooker scarf pillow "
            "blanket thermos microwave fan heater camera").split()
FORMATS = ("This {p} is {a}. {t}", "The {p} arrived and it is {a}. {t}", "{A} {p}! {t}",
           "I bought this {p} last week. It is {a}. {t}", "Honestly, a {a} {p}. {t}")
QUESTION = "Review: {review}\nIs this review positive or negative?"


def rows(products: list[str], n: int, seed: int, prefix: str) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = ("positive", "negative")[i % 2]
        adjective = rng.choice(POSITIVE if label == "positive" else NEGATIVE)
        product = rng.choice(products).replace("-", " ")
        review = rng.choice(FORMATS).format(p=product, a=adjective, A=adjective.capitalize(),
                                            t=rng.choice(TAILS[label]))
        out.append({"task_id": f"{prefix}-{i}", "messages": [{"role": "user", "content": QUESTION.format(review=review)}],
                    "label": label, "reference": f"Label: {label}"})
    rng.shuffle(out)
    return out


def main() -> None:
    products = list(PRODUCTS)
    random.Random(0).shuffle(products)  # fixed: the held-out products never move
    train, held_out = products[:28], products[28:]
    files = {"eval": rows(held_out, 48, seed=2, prefix="eval"), "tasks": rows(train, 256, seed=1, prefix="task")}
    for name, got in files.items():
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
        print(f"{name}.jsonl: {len(got)} rows")


if __name__ == "__main__":
    main()
