"""Local training text for the tests' tiny model, generated in code (nothing is downloaded).

Documents are trained on in two stages, "learn" then "calibrate" (see `tests.helpers.tiny.model`):
- simple English sentences (plain text), so the model's vocabulary and output look like language;
- short assistant chats (greetings, colours, animals, small facts), so any chat gets a sane reply;
- scenario-specific chats, the contributions in `CONTRIBUTIONS` (modules beside this one), so the
  model knows a test scenario's format and domain before any learning.

A contribution is `fn(rng: random.Random) -> {"learn": [chat, ...], "calibrate": [chat, ...]}`.
Each gets its own rng, seeded from (seed, its name), so adding one leaves the others' text as it was.

Why two stages: a bundled scenario's base model should be *weak* (<= 30% held-out success at
temperature 1) yet *learnable* by RL from its own samples. A model that never samples a right answer
gives RL no reward to reinforce (GRPO from scratch collapses); one trained on clean answers leaves
nothing to learn. So a contribution teaches the task correctly in "learn" and then, in "calibrate",
with a systematically wrong teacher (demo-add: mostly "+1"): what RL has to move is probability the
model already has, onto the right mode (`add_corpus.py` has the numbers).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tests.helpers.tiny import add_corpus, agent_corpus, reviews, rules, shop
from tests.helpers.tiny.chat_format import Chat, split_tools, tool_call_text, tool_signature

STAGES = ("learn", "calibrate")
# (general chats, plain texts) per stage: English runs through both stages so it is not forgotten.
GENERAL_PER_STAGE = {"learn": (800, 400), "calibrate": (1600, 800)}

Contribution = Callable[[random.Random], Mapping[str, list[Chat]]]
# The names the `reef.corpus` entry points had when these parts lived in reef/: each seeds its
# part's rng, so keeping them keeps the corpus, and the built model, byte for byte.
CONTRIBUTIONS: dict[str, Contribution] = {
    "demo-add": add_corpus.contribution,
    "reviews": reviews.contribution,
    "rules": rules.contribution,
    "shop": shop.contribution,
    "tool-use": agent_corpus.contribution,
}

_ADJ = (
    "big small red blue green old young happy quiet bright dark warm cold tall short kind brave "
    "busy clever gentle funny little new slow fast soft loud clean"
).split()
_NOUNS = (
    "cat dog bird fish tree house car boat child teacher farmer river city garden ball book horse "
    "rabbit doctor baker friend mother father sister brother window door flower apple letter song"
).split()
_VERBS = "sees finds likes helps follows watches carries paints visits draws reads opens makes loves".split()
_PLACES = "park school market forest beach kitchen library village road hill station lake farm shop".split()
_TIMES = [
    "Today",
    "In the morning",
    "At night",
    "After lunch",
    "Every day",
    "On Sunday",
    "In the summer",
    "Before dinner",
]
_COLORS = {
    "the sky": "blue",
    "grass": "green",
    "snow": "white",
    "a banana": "yellow",
    "coal": "black",
    "a tomato": "red",
    "an orange": "orange",
    "a cloud": "white",
    "the sun": "yellow",
    "a leaf": "green",
    "milk": "white",
    "a strawberry": "red",
}
_SOUNDS = {
    "cow": "moo",
    "dog": "woof",
    "cat": "meow",
    "duck": "quack",
    "sheep": "baa",
    "owl": "hoot",
    "horse": "neigh",
    "bee": "buzz",
}
_FACTS = {
    "cats": "Cats are small animals. They like to sleep and play.",
    "dogs": "Dogs are loyal animals. They like to run and play.",
    "the sun": "The sun is a star. It gives us light and heat.",
    "water": "Water is a liquid. People and plants need it to live.",
    "trees": "Trees are tall plants. They give us shade and clean air.",
    "the moon": "The moon goes around the earth. It shines at night.",
    "books": "Books hold stories and ideas. Reading them helps us learn.",
    "rain": "Rain is water that falls from clouds. It helps plants grow.",
    "bees": "Bees are insects. They make honey and help flowers grow.",
    "the sea": "The sea is large and salty. Many fish live in it.",
    "music": "Music is made of sounds and rhythm. People sing and dance to it.",
    "winter": "Winter is the coldest season. Sometimes it snows.",
}
_GREETINGS = ["Hello!", "Hi!", "Hi there.", "Good morning!", "Hey, how are you?", "Good evening."]
_GREETING_REPLIES = [
    "Hello! How can I help you today?",
    "Hi! What can I do for you?",
    "I am doing well, thank you. How can I help?",
]
_THANKS = ["Thanks!", "Thank you.", "Great, thanks."]
_THANKS_REPLIES = ["You are welcome!", "Glad to help.", "Any time!"]
_GENERAL_SYSTEM = "You are a helpful assistant."


@dataclass
class Stage:
    """Documents trained on in one stage of the warm start (in a seeded order, by the trainer)."""

    name: str
    chats: list[Chat] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)


@dataclass
class Corpus:
    stages: list[Stage]

    def sha256(self) -> str:
        blob = json.dumps([[s.name, s.chats, s.texts] for s in self.stages], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def tokenizer_texts(self) -> list[str]:
        """Every string the tokenizer must cover, without the ChatML markup (added as special tokens)."""
        out: list[str] = []
        for stage in self.stages:
            out.extend(stage.texts)
            for chat in stage.chats:
                messages, tools = split_tools(chat)
                if tools:
                    out.append("<tools>" + "".join("\n" + tool_signature(t) for t in tools) + "\n</tools>")
                for m in messages:
                    text = m["content"] if isinstance(m.get("content"), str) else ""
                    text += "".join(tool_call_text(c) for c in m.get("tool_calls") or ())
                    out.append(f"{m['role']}\n{text}")
        return out


def sentence(rng: random.Random) -> str:
    a, b = rng.sample(_NOUNS, 2)
    kind = rng.randrange(3)
    if kind == 0:
        return f"The {rng.choice(_ADJ)} {a} {rng.choice(_VERBS)} the {rng.choice(_ADJ)} {b}."
    if kind == 1:
        return f"{rng.choice(_TIMES)} the {a} goes to the {rng.choice(_PLACES)}."
    return f"A {a} and a {b} are in the {rng.choice(_PLACES)}. The {a} is {rng.choice(_ADJ)}."


def general_chat(rng: random.Random) -> Chat:
    kind = rng.randrange(5)
    if kind == 0:
        thing, color = rng.choice(list(_COLORS.items()))
        turns = [(f"What color is {thing}?", f"{thing[0].upper()}{thing[1:]} is {color}.")]
    elif kind == 1:
        animal, sound = rng.choice(list(_SOUNDS.items()))
        turns = [(f"What sound does a {animal} make?", f"A {animal} says {sound}.")]
    elif kind == 2:
        topic, fact = rng.choice(list(_FACTS.items()))
        turns = [(f"Tell me about {topic}.", fact)]
    elif kind == 3:
        turns = [(rng.choice(_GREETINGS), rng.choice(_GREETING_REPLIES))]
    else:
        turns = [("Write a short sentence.", sentence(rng))]
    if rng.random() < 0.3:
        turns.append((rng.choice(_THANKS), rng.choice(_THANKS_REPLIES)))
    chat: Chat = [{"role": "system", "content": _GENERAL_SYSTEM}] if rng.random() < 0.5 else []
    for user, assistant in turns:
        chat += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return chat


def contributions() -> dict[str, Contribution]:
    """The scenario-specific contributions, by name (the name seeds each one's rng: renaming one
    changes its text, and so the model)."""
    return dict(CONTRIBUTIONS)


def build_corpus(seed: int = 0, extra: Mapping[str, Contribution] | None = None) -> Corpus:
    """The two-stage warm start: every contribution's chats, then general English, per stage.
    `extra` adds contributions to the installed ones (same name: `extra` wins)."""
    found = {**contributions(), **(extra or {})}
    stages = [Stage(name) for name in STAGES]
    for name in sorted(found):
        chats = found[name](random.Random(f"{seed}:{name}"))
        unknown = set(chats) - set(STAGES)
        if unknown:
            raise ValueError(f"corpus contribution {name!r} gave unknown stages {sorted(unknown)}; use {STAGES}")
        for stage in stages:
            stage.chats += chats.get(stage.name, [])
    rng = random.Random(seed)
    for stage in stages:
        n_chats, n_texts = GENERAL_PER_STAGE[stage.name]
        stage.chats += [general_chat(rng) for _ in range(n_chats)]
        stage.texts += [" ".join(sentence(rng) for _ in range(rng.randint(1, 3))) for _ in range(n_texts)]
    return Corpus(stages)
