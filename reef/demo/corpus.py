"""demo-add's part of the tiny model's corpus (a `reef.corpus` contribution, see `reef.model.corpus`).

Stage "learn" answers every prompt correctly, so the model learns the sums: learning them straight
from a noisy teacher took far longer than a couple of CPU minutes, since most labels point elsewhere.
Stage "calibrate" answers with a noisy teacher: right 15% of the time, off by one (+1) 65%, some
other number 20%. The systematic +1 keeps greedy decoding mostly wrong too, while the sums stay
represented in the model. Sampling at temperature 1 then hits the right answer ~20% of the time
(a little of stage "learn" remains), and RL / rejection sampling only has to move probability the
model already has onto the right mode: in a check, rejection-sampling fine-tuning on train prompts
took held-out success from 20% to 87% in one round (6 s) and ~100% in four (40 s) on CPU.
Held-out pairs are in this warm start like every pair, but never in RL traffic: what must
generalise to them is the shift from +1 to the right sum, not the arithmetic.
"""

from __future__ import annotations

import random

from reef.demo import task as demo
from reef.model.corpus import Chat

TEACHER_ACCURACY = 0.15
TEACHER_OFF_BY_ONE = 0.65  # the rest is a uniformly random wrong number
# Copies of each of the 400 prompts per stage; in "calibrate" they are independent teacher draws,
# so the model sees each prompt's mix of answers rather than one fixed wrong answer.
TASK_COPIES_LEARN = 6
TASK_COPIES_CALIBRATE = 12


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


def contribution(rng: random.Random) -> dict[str, list[Chat]]:
    return {"learn": task_chats(rng, 1.0, TASK_COPIES_LEARN),
            "calibrate": task_chats(rng, TEACHER_ACCURACY, TASK_COPIES_CALIBRATE)}
