"""Rewards: a scenario's verifier or judge, called as one batch `reward(tasks, replies) -> [Score]`.

A `module:function` reward is either
- per task: `fn(task: dict, reply: str) -> float | (float, str)` (the str is feedback), or
- TRL-style (`GRPOTrainer(reward_funcs=...)`): `fn(prompts, completions, **columns) -> list[float]`,
  recognised by a parameter named `completions`. It gets conversational prompts and completions
  (`[{"role": "assistant", "content": reply}]`) and every other task field as a column, so reward
  functions written for TRL work unchanged. `None` in its list means "could not score".
A judge (`{judge: {...}}`) asks a chat model to grade the reply by a rubric and parses `Score: X`.
A reply that cannot be scored is a `Score(None, reason)`: counted as missing, never as 0.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from reef.scenario.schema import JudgeSpec


@dataclass(frozen=True)
class Score:
    value: float | None  # None: the reward could not score this reply
    feedback: str | None = None


class RewardFn(Protocol):
    def __call__(self, tasks: Sequence[dict[str, Any]], replies: Sequence[str]) -> list[Score]: ...


class RewardError(ValueError):
    """The reward could not be loaded, raised, or returned something that is not a score."""


def import_ref(ref: str, base_dir: Path | None = None) -> Any:
    """`package.module:attr`, importing from `base_dir` too (a reward file next to serve.yaml)."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise RewardError(f"{ref!r} is not of the form module:function")
    if base_dir is not None and str(base_dir) not in sys.path:
        sys.path.insert(0, str(base_dir))
    try:
        module = _from_base_dir(module_name, base_dir) or importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the declaration's fault
        raise RewardError(f"cannot import {module_name!r}: {exc}") from exc
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise RewardError(f"{module_name!r} has no attribute {attr!r}") from exc
    return obj


def _from_base_dir(module_name: str, base_dir: Path | None) -> Any:
    """The module from its file in `base_dir`, when there is one (else None: a normal import).

    Module names are process-wide, so two scenarios' `reward.py` (each next to its own serve.yaml)
    would otherwise both resolve to whichever was imported first, or to whichever folder comes
    first on `sys.path`. A module found elsewhere under the same name leaves this one to be
    loaded from its file, under a name made unique by its path.
    """
    if base_dir is None:
        return None
    rel = Path(*module_name.split("."))
    path = next((p for p in (base_dir / rel.with_suffix(".py"), base_dir / rel / "__init__.py") if p.is_file()), None)
    if path is None:
        return None
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    if Path(getattr(module, "__file__", None) or "").resolve() == path.resolve():
        return module
    unique = f"{module_name}__at_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}"
    if unique not in sys.modules:
        spec = importlib.util.spec_from_file_location(unique, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[unique] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[unique]
            raise
    return sys.modules[unique]


def _number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardError(f"{where} returned {value!r}, not a number")
    if not math.isfinite(value):
        raise RewardError(f"{where} returned {value!r}, not a finite number")
    return float(value)


def _per_task(fn: Callable[..., Any], ref: str) -> RewardFn:
    def reward(tasks: Sequence[dict[str, Any]], replies: Sequence[str]) -> list[Score]:
        out = []
        for task, reply in zip(tasks, replies, strict=True):
            try:
                got = fn(task, reply)
            except Exception as exc:  # noqa: BLE001 - surfaced with the reward's name
                raise RewardError(f"{ref} raised {type(exc).__name__}: {exc}") from exc
            if isinstance(got, tuple):
                if len(got) != 2 or not (got[1] is None or isinstance(got[1], str)):
                    raise RewardError(f"{ref} returned {got!r}; expected a float or (float, feedback str)")
                out.append(Score(_number(got[0], ref), got[1]))
            else:
                out.append(Score(_number(got, ref)))
        return out

    return reward


def _trl_style(fn: Callable[..., Any], ref: str) -> RewardFn:
    def reward(tasks: Sequence[dict[str, Any]], replies: Sequence[str]) -> list[Score]:
        columns = sorted({k for t in tasks for k in t if k not in ("messages", "prompt", "completion")})
        kwargs = {k: [t.get(k) for t in tasks] for k in columns}
        try:
            got = fn(prompts=[t["messages"] for t in tasks],
                     completions=[[{"role": "assistant", "content": r}] for r in replies], **kwargs)
        except Exception as exc:  # noqa: BLE001
            raise RewardError(f"{ref} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(got, list | tuple) or len(got) != len(replies):
            raise RewardError(f"{ref} returned {type(got).__name__} of length "
                              f"{len(got) if hasattr(got, '__len__') else '?'}; expected {len(replies)} floats")
        return [Score(_number(v, ref)) for v in got]

    return reward


def is_trl_style(fn: Callable[..., Any]) -> bool:
    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def function_reward(ref: str, base_dir: Path | None = None) -> RewardFn:
    fn = import_ref(ref, base_dir)
    if not callable(fn):
        raise RewardError(f"{ref} is not callable")
    return _trl_style(fn, ref) if is_trl_style(fn) else _per_task(fn, ref)


# --- the judge --------------------------------------------------------------------------------

JUDGE_SYSTEM = ("You are a strict grader. Read the rubric, the conversation and the reply, then answer "
                "with one line: 'Score: X', where X is a number from 0 to {scale}.")
_FRACTION = re.compile(r"(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")
_SCORE = re.compile(r"score\s*[:=]?\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)


def judge_messages(spec: JudgeSpec, task: dict[str, Any], reply: str) -> list[dict[str, str]]:
    """The judge's prompt: the rubric, the task's conversation as text, and the reply to grade."""
    turns = []
    for m in task["messages"]:
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        turns.append(f"{m['role']}: {content or ''}")
    scale = f"{spec.scale:g}"
    user = (f"Rubric:\n{spec.rubric}\n\nConversation:\n" + "\n".join(turns)
            + f"\n\nReply to grade:\n{reply}\n\nAnswer with 'Score: X' (0 to {scale}).")
    return [{"role": "system", "content": JUDGE_SYSTEM.format(scale=scale)}, {"role": "user", "content": user}]


def parse_judge_score(text: str, scale: float = 1.0) -> float | None:
    """`Score: 7` (of `scale`), `7/10`, or a bare number -> a score in [0, 1]; None when absent or out of range."""
    text = text or ""
    match = _SCORE.search(text)
    if match:
        value = float(match.group(1)) / scale
    elif (frac := _FRACTION.search(text)) and float(frac.group(2)) > 0:
        value = float(frac.group(1)) / float(frac.group(2))
    else:
        bare = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*\.?\s*", text)
        if not bare:
            return None
        value = float(bare.group(1)) / scale
    return value if 0.0 <= value <= 1.0 else None


def judge_reward(spec: JudgeSpec, engine_url: str | None = None, engine_model: str | None = None,
                 timeout_s: float = 120.0) -> RewardFn:
    """A judge over an OpenAI-compatible endpoint: `spec.url`, else the served engine's."""
    import httpx

    from reef.core.chat import ChatError, chat, chat_body

    def reward(tasks: Sequence[dict[str, Any]], replies: Sequence[str]) -> list[Score]:
        url = spec.url or engine_url
        model = spec.model or engine_model
        if url is None or model is None:
            raise RewardError("the judge has no url/model and no served engine was given")
        headers = {"authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
        out = []
        with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s, headers=headers) as client:
            for task, reply in zip(tasks, replies, strict=True):
                values, raw = [], []
                for _ in range(spec.votes):
                    try:
                        text = chat(client, chat_body(model, judge_messages(spec, task, reply),
                                                      max_tokens=spec.max_tokens, temperature=spec.temperature)).text
                    except ChatError as exc:
                        raise RewardError(f"judge at {url} answered {exc.problem or exc.status}: "
                                          f"{exc.text[:200]}") from exc
                    raw.append(text)
                    value = parse_judge_score(text, spec.scale)
                    if value is not None:
                        values.append(value)
                if values:
                    out.append(Score(sum(values) / len(values), raw[0]))
                else:
                    out.append(Score(None, f"judge reply not scorable: {raw[0][:200]!r}"))
        return out

    return reward
