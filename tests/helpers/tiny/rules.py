"""The bundled `demo-rules` scenario: name the kind of a word (fruit, animal or color), and its part of
the tiny model's corpus (a contribution, see `corpus.py`) that teaches the model
to obey rules given in its system prompt. It exists so harness evolution has something real to find.

The client's system prompt only says what to do ("Say what kind of thing the word is: ..."); the
reward wants the bare label (`fruit`) and says so in its feedback ("Reply with only the label.").
The model answers in a sentence (`It is a fruit.`) unless a rule in its system prompt tells it
otherwise, so the base harness scores ~0 and a harness whose rules say "Reply with only the label."
(what `recipes/harness_evolve` mines from that recurring feedback) scores high with the same weights.

The corpus teaches two rules, each alone, both, or none, with the rules placed before or after the
task prompt, with or without a list dash and a generic first line (the shapes a served harness
takes once `harness.inject: system_prepend` puts system.md and rules.md before the client's prompt):

    rules                      reply
    (none)                     It is a fruit.
    Reply with only the label. fruit
    Put the label in brackets. It is a [fruit].
    both                       [fruit]

Both stages answer correctly: what is weak on purpose is the base harness, not the model.
Words are split once into train and held-out ones: the eval file has only held-out words, the
task file (simulated traffic) only train ones; the corpus has every word.

    python -m tests.helpers.tiny.rules    # rewrite data/rules-eval.jsonl and data/rules-tasks.jsonl
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from reef.scenario import EvalSpec, HarnessSpec, Scenario
from tests.helpers.tiny.chat_format import Chat

HERE = Path(__file__).resolve().parent
SCENARIO = "demo-rules"
SYSTEM_PROMPT = "Say what kind of thing the word is: fruit, animal or color."
RULE_LABEL = "Reply with only the label."
RULE_BRACKETS = "Put the label in brackets."
GENERIC_FIRST_LINE = "You are a helpful assistant."
WORDS = {
    "fruit": "apple banana pear grape lemon cherry peach plum mango melon kiwi lime".split(),
    "animal": "cat dog horse cow duck sheep owl bee fox goat frog mouse".split(),
    "color": "red blue green yellow black white pink brown purple gray gold silver".split(),
}
KINDS = tuple(WORDS)
QUESTIONS = ("Word: {w}", "What kind of thing is {w}?", "Sort this word: {w}")
HELD_OUT_PER_KIND = 4
_SPLIT_SEED = 2718  # fixed, independent of any training seed: held-out words never move
CHATS_PER_STAGE = {"learn": 400, "calibrate": 400}
# (label rule, brackets rule) mixes: none, label only, brackets only, both.
_MIXES = ((False, False, 0.35), (True, False, 0.35), (False, True, 0.15), (True, True, 0.15))


def split_words() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train (word, kind) pairs, held-out pairs)."""
    rng = random.Random(_SPLIT_SEED)
    train, held = [], []
    for kind, words in WORDS.items():
        out = set(rng.sample(words, HELD_OUT_PER_KIND))
        train += [(w, kind) for w in words if w not in out]
        held += [(w, kind) for w in words if w in out]
    return train, held


def reply_for(kind: str, label_only: bool, brackets: bool) -> str:
    label = f"[{kind}]" if brackets else kind
    if label_only:
        return label
    return f"It is {'an' if kind == 'animal' else 'a'} {label}."


def system_for(rng: random.Random, rules: list[str]) -> str:
    """The client's task prompt with `rules` around it, in one of the shapes a served harness takes."""
    blocks = [SYSTEM_PROMPT]
    if rules:
        dash = rng.random() < 0.5
        block = "\n".join(f"- {r}" if dash else r for r in rules)
        blocks.insert(0 if rng.random() < 0.8 else 1, block)
    if rng.random() < 0.3:
        blocks.insert(0, GENERIC_FIRST_LINE)
    return "\n\n".join(blocks)


def messages(word: str, question: int = 0, system: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[question].format(w=word)}]


def _mix(roll: float) -> tuple[bool, bool]:
    for label_only, brackets, share in _MIXES:
        if roll < share:
            return label_only, brackets
        roll -= share
    return _MIXES[-1][0], _MIXES[-1][1]


def _chat(rng: random.Random) -> Chat:
    kind = rng.choice(KINDS)
    word = rng.choice(WORDS[kind])
    label_only, brackets = _mix(rng.random())
    rules = [RULE_LABEL] * label_only + [RULE_BRACKETS] * brackets
    rng.shuffle(rules)
    chat = messages(word, rng.randrange(len(QUESTIONS)), system_for(rng, rules))
    return [*chat, {"role": "assistant", "content": reply_for(kind, label_only, brackets)}]


def contribution(rng: random.Random) -> dict[str, list[Chat]]:
    return {stage: [_chat(rng) for _ in range(n)] for stage, n in CHATS_PER_STAGE.items()}


# --- the scenario ------------------------------------------------------------------------------


def reward(task: dict[str, Any], reply: str) -> tuple[float, str]:
    """1 for the bare label (case and a final period aside); the feedback says what was wrong."""
    want, word = str(task["label"]), str(task["word"])
    said = (reply or "").strip().lower().rstrip(".").strip()
    if said == want:
        return 1.0, "Correct."
    if said in KINDS:
        return 0.0, f"Wrong label: the word {word} is a {want}."
    return 0.0, RULE_LABEL if want in said else f"{RULE_LABEL} The word {word} is a {want}."


def rows(pairs: list[tuple[str, str]], prefix: str) -> list[dict[str, Any]]:
    return [{"task_id": f"{prefix}-{i * len(QUESTIONS) + q}", "messages": messages(word, q), "label": kind,
             "word": word} for i, (word, kind) in enumerate(pairs) for q in range(len(QUESTIONS))]


def scenario() -> Scenario:
    return Scenario(
        name=SCENARIO,
        description="name a word's kind (fruit, animal, color); the reply must be the bare label",
        reward="tests.helpers.tiny.rules:reward",
        eval=EvalSpec(path=Path("data/rules-eval.jsonl"), max_new_tokens=8, samples=4, temperature=1.0),
        tasks=Path("data/rules-tasks.jsonl"),
        # No recipe declared here: a packaged recipe would give every learner-enabled server a round
        # for this scenario; serve.yaml opts in (`scenarios: {demo-rules: {recipe: harness_evolve}}`).
        harness=HarnessSpec(inject="system_prepend"),
        base_dir=HERE,
    )


def write_files() -> None:
    train, held = split_words()
    (HERE / "data").mkdir(exist_ok=True)
    for name, data in (("rules-eval", rows(held, "eval")), ("rules-tasks", rows(train, "task"))):
        (HERE / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))


if __name__ == "__main__":
    write_files()
