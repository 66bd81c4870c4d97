"""Write eval.jsonl and tasks.jsonl: 80 held-out reviews (of products no task mentions) and 320
training reviews, half positive, half negative.

    python examples/reviews/generate.py

The review text comes from `reef.demo.reviews`, the same generator the embedded tiny model's corpus
uses (so the tiny model knows the domain); a scenario of your own brings its own files instead.
"""

import json
from pathlib import Path

from reef.demo.reviews import rows, split_products

HERE = Path(__file__).resolve().parent


def main() -> None:
    train, held_out = split_products()
    files = {"eval": rows(held_out, per_label=40, seed=1, prefix="eval"),
             "tasks": rows(train, per_label=160, seed=2, prefix="task")}
    texts = {name: {r["messages"][-1]["content"] for r in got} for name, got in files.items()}
    assert not texts["eval"] & texts["tasks"], "eval rows must be held out from the tasks"
    for name, got in files.items():
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
        print(f"{name}.jsonl: {len(got)} rows")


if __name__ == "__main__":
    main()
