"""The one episode loop for scenarios with an environment (reef.scenario.environment), over any
`Sampler`: model -> tool calls executed by the environment -> model ... -> final reply."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from reef.sampling.completion import Completion, Sampler, TokenSampler
from reef.scenario.environment import Environment, EpisodeState, Task, parse_reply


def run_episodes(sampler: Sampler, tasks: Sequence[Task], environment: Environment, max_turns: int, n: int, *,
                 max_new_tokens: int, temperature: float, seed: int | None = None,
                 exact_ids: bool = False) -> list[list[Completion]]:
    """`n` episodes per task, every unfinished episode's next turn in one `sampler` call; turn t is
    seeded `seed + t` (None: not reseeded).

    By default each turn sends the conversation so far, as a served agent's next request does (the
    backend renders it again), and an episode's completion holds its final reply's text. With
    `exact_ids` (a `TokenSampler`) each turn continues exactly the ids the episode holds: its
    completion is every turn after the task's prompt, `action_mask` 1 on the model's own tokens and
    0 on the tool results and turn markup between them (what a policy gradient trains on)."""
    tokens = cast(TokenSampler, sampler) if exact_ids else None
    states = [[EpisodeState(task, environment, max_turns) for _ in range(n)] for task in tasks]
    flat = [state for group in states for state in group]
    prompts = [tokens.prompt_ids(s.messages, s.task.get("tools")) if tokens else [] for s in flat]
    ids: list[list[int]] = [[] for _ in flat]
    masks: list[list[int]] = [[] for _ in flat]
    finish = ["stop"] * len(flat)
    turn = 0
    while active := [k for k, s in enumerate(flat) if not s.done]:
        turn_seed = None if seed is None else seed + turn
        if tokens:
            got = tokens.sample_ids([prompts[k] + ids[k] for k in active], 1, max_new_tokens=max_new_tokens,
                                    temperature=temperature, seed=turn_seed)
        else:
            got = sampler.sample([flat[k].messages for k in active], 1, max_new_tokens=max_new_tokens,
                                 temperature=temperature, seed=turn_seed,
                                 tools=[flat[k].task.get("tools") for k in active])
        for k, (reply,) in zip(active, got, strict=True):
            state, reply_at = flat[k], len(flat[k].messages)
            went_on = state.advance(parse_reply(reply.text))  # tool results came back: the episode goes on
            finish[k] = reply.finish_reason
            if tokens:
                tools = state.task.get("tools")
                context = tokens.between_turns(reply, state.messages, reply_at, tools) if went_on else []
                ids[k] += reply.completion_ids + context
                masks[k] += [1] * len(reply.completion_ids) + [0] * len(context)
        turn += 1
    out = [Completion(prompts[k], ids[k], s.reply or "", finish[k], action_mask=masks[k]) for k, s in enumerate(flat)]
    return [out[i * n : (i + 1) * n] for i in range(len(tasks))]
