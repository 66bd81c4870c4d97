"""demo-add's part of the tiny model's corpus (a contribution, see `corpus.py`).

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

"calibrate" also holds second tries: a wrong first answer, the demo users' doubt ("Are you sure?
Check it and answer again.", reef.traffic.simulate), and a second answer that is right half the
time. Re-prompted with the doubt, the model is then right about twice as often as at its first try,
which is what gives the `next_turn` recipe hindsight targets to distil: without them the base
model re-prompted with the doubt was never right, and next_turn learnt from its RL part alone.
"""

from __future__ import annotations

import random

from reef.traffic.simulate import FOLLOW_UP
from tests.helpers.tiny import task as demo
from tests.helpers.tiny.chat_format import Chat

TEACHER_ACCURACY = 0.15
TEACHER_OFF_BY_ONE = 0.65  # the rest is a uniformly random wrong number
# Copies of each of the 400 prompts per stage; in "calibrate" they are independent teacher draws,
# so the model sees each prompt's mix of answers rather than one fixed wrong answer.
TASK_COPIES_LEARN = 6
TASK_COPIES_CALIBRATE = 12
RETRY_CHATS = 800
RETRY_ACCURACY = 0.5  # of the second answer, after the doubt; the first is always wrong


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


def retry_chats(rng: random.Random, n: int) -> list[Chat]:
    tasks = demo.all_tasks()
    chats = []
    for _ in range(n):
        task = rng.choice(tasks)
        first = teacher_answer(rng, task.answer, 0.0)
        second = task.answer if rng.random() < RETRY_ACCURACY else teacher_answer(rng, task.answer, 0.0)
        chats.append([*task.messages, {"role": "assistant", "content": demo.format_answer(first)},
                      {"role": "user", "content": FOLLOW_UP},
                      {"role": "assistant", "content": demo.format_answer(second)}])
    return chats


def contribution(rng: random.Random) -> dict[str, list[Chat]]:
    learn = task_chats(rng, 1.0, TASK_COPIES_LEARN)
    calibrate = task_chats(rng, TEACHER_ACCURACY, TASK_COPIES_CALIBRATE)
    return {"learn": learn, "calibrate": calibrate + retry_chats(rng, RETRY_CHATS)}
