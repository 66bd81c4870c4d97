"""Write eval.jsonl and tasks.jsonl: 80 held-out tasks (items no training task asks about) and 320
training tasks, each with its own hidden price.

    python examples/shop/generate.py

The text comes from `reef.demo.shop` (which also holds the embedded tiny model's corpus part for it;
a scenario of your own brings its own files instead).
"""

from pathlib import Path

from reef.demo.shop import as_jsonl, rows, split_items

HERE = Path(__file__).resolve().parent


def main() -> None:
    train, held_out = split_items()
    files = {"eval": rows(held_out, 80, seed=1, prefix="eval"), "tasks": rows(train, 320, seed=2, prefix="task")}
    assert not {r["item"] for r in files["eval"]} & {r["item"] for r in files["tasks"]}, "eval items are held out"
    for name, got in files.items():
        (HERE / f"{name}.jsonl").write_text(as_jsonl(got))
        print(f"{name}.jsonl: {len(got)} rows")


if __name__ == "__main__":
    main()
