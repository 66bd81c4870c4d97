"""Local training text for the embedded tiny model, generated in code (nothing is downloaded).

Three kinds of documents, all from one seeded RNG so a seed gives byte-identical text:
- simple English sentences (plain text), so the model's vocabulary and output look like language;
- short assistant chats (greetings, colours, animals, small facts), so any chat gets a sane reply;
- the demo task (`reef.demo.task`) answered by a *noisy teacher*.

Why the teacher is noisy: the base model has to be weak on the demo task (<= 30% held-out
success) yet learnable by RL from its own samples. A model that never produces a right answer
gives RL no reward to reinforce (GRPO from scratch collapses), and one trained on clean answers
leaves nothing to learn. So the warm start teaches the answer *format* everywhere and the right
*sum* only a quarter of the time; half the time the teacher is off by one (a systematic mistake,
which keeps greedy decoding wrong too) and otherwise it says some other number. Sampling at
temperature 1 then hits the right answer ~20-25% of the time, and rejection sampling / RL only
has to shift probability mass the model already has onto the right mode. Held-out pairs are in
this warm start (with the same noisy answers) but never in RL traffic: what must generalise to
them is the shift, not the arithmetic.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field

from reef.demo import task as demo

TEACHER_ACCURACY = 0.25
TEACHER_OFF_BY_ONE = 0.5  # the rest is a uniformly random wrong number
# Copies of each of the 400 prompts per stage; in "calibrate" they are independent teacher draws,
# so the model sees each prompt's answer mixture rather than one fixed wrong answer.
TASK_COPIES_LEARN = 6
TASK_COPIES_CALIBRATE = 8

Chat = list[dict[str, str]]

_ADJ = "big small red blue green old young happy quiet bright dark warm cold tall short kind".split()
_NOUNS = "cat dog bird fish tree house car boat child teacher farmer river city garden ball book".split()
_VERBS = "sees finds likes helps follows watches carries paints visits draws".split()
_PLACES = "park school market forest beach kitchen library village road hill".split()
_TIMES = "Today In the morning At night After lunch Every day On Sunday".split(" ")
_COLORS = {
    "the sky": "blue", "grass": "green", "snow": "white", "a banana": "yellow", "coal": "black",
    "a tomato": "red", "an orange": "orange", "a cloud": "white", "the sun": "yellow", "a leaf": "green",
}
_SOUNDS = {"cow": "moo", "dog": "woof", "cat": "meow", "duck": "quack", "sheep": "baa", "owl": "hoot"}
_FACTS = {
    "cats": "Cats are small animals. They like to sleep and play.",
    "dogs": "Dogs are loyal animals. They like to run and play.",
    "the sun": "The sun is a star. It gives us light and heat.",
    "water": "Water is a liquid. People and plants need it to live.",
    "trees": "Trees are tall plants. They give us shade and air.",
    "the moon": "The moon goes around the earth. It shines at night.",
    "books": "Books hold stories and ideas. Reading them helps us learn.",
    "rain": "Rain is water that falls from clouds. It helps plants grow.",
}
_GREETINGS = ["Hello!", "Hi!", "Hi there.", "Good morning!", "Hey, how are you?"]
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
    """Documents trained on in one stage of the warm start, in a seeded order."""

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
                out.extend(f"{m['role']}\n{m['content']}" for m in chat)
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


def teacher_answer(rng: random.Random, answer: int, accuracy: float) -> int:
    roll = rng.random()
    if roll < accuracy:
        return answer
    if roll < accuracy + TEACHER_OFF_BY_ONE:
        return answer + 1
    return rng.choice([v for v in range(19) if v != answer])


def task_chats(rng: random.Random, accuracy: float, copies: int) -> list[Chat]:
    chats = []
    for _ in range(copies):
        for task in demo.all_tasks():
            reply = demo.format_answer(teacher_answer(rng, task.answer, accuracy))
            chats.append([*task.messages, {"role": "assistant", "content": reply}])
    return chats


def _general(rng: random.Random, chats: int, texts: int) -> tuple[list[Chat], list[str]]:
    return (
        [general_chat(rng) for _ in range(chats)],
        [" ".join(sentence(rng) for _ in range(rng.randint(1, 3))) for _ in range(texts)],
    )


def build_corpus(seed: int = 0) -> Corpus:
    """The two-stage warm start (see the module docstring).

    Stage "learn": the demo task with a correct teacher, so the model learns the sums; learning
    them straight from the noisy teacher takes far longer than a couple of CPU minutes, since 3 of
    4 labels point elsewhere. Stage "calibrate": the noisy teacher, which moves the model's reply
    distribution to ~25% right / ~50% off by one while the sums stay represented inside it.
    General English runs through both stages, so chat skills are neither lost nor overtrained.
    """
    rng = random.Random(seed)
    learn = Stage("learn", task_chats(rng, 1.0, TASK_COPIES_LEARN), [])
    calibrate = Stage("calibrate", task_chats(rng, TEACHER_ACCURACY, TASK_COPIES_CALIBRATE), [])
    for stage, (chats, texts) in ((learn, (800, 400)), (calibrate, (1600, 800))):
        more_chats, more_texts = _general(rng, chats, texts)
        stage.chats += more_chats
        stage.texts += more_texts
    return Corpus([learn, calibrate])
