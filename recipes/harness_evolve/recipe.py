"""Harness evolution, in the spirit of GEPA and SkillClaw: read the scenario's low-reward replies and
their feedback, and propose mutations of the head's harness (create, update or remove a system
prompt, a rule, a skill `skills/<name>/SKILL.md`, a few-shot example). The candidate is a harness
tree, not weights (the folder contract is in reef.recipe.harness_recipe); the gate then compares it with
the head on the eval suite, same weights, each prompt sent with its arm's harness.

Two proposers (`proposer:`):
- `mined` (deterministic, no model): splits the failures' feedback into sentences and turns the
  ones that recur in at least `min_support` of the failed records (and `min_count` of them) into
  rules, appended to `rules.md` (created when absent), at most `max_rules` per round, skipping what
  the harness says already. "Reply with only the label." said on most failures becomes a rule. And
  while the harness has no few-shot examples yet, up to `max_shots` of the corrections (the reply a
  failure's report wanted) and the rewarded replies (at least `failure_below`, tool calls kept)
  become `shots.jsonl` (the user's message and the wanted reply, distinct replies first,
  reef.recipe.shots): a small model that ignores a rule it is told follows a format it is shown.
  The learner's harness rung (reef.learn.harness_rung) runs this proposer on a few rewarded replies.
- `llm`: shows a model the harness files and up to `max_examples` failures (prompt, reply, score,
  feedback) and asks for mutations as JSON (`{"mutations": [{"op", "path", "content", "reason"}]}`).
  The model is `teacher_url`/`teacher_model` (any OpenAI-compatible server), else the serving engine
  the round was given (the learner passes its vLLM). Mutations that do not fit the tree are left out.

    reef recipe run harness_evolve --set scenario=orders      # examples/orders, from its folder
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass

import httpx
from pydantic import ValidationError

from reef.core.chat import ChatError, chat, chat_body
from reef.recipe.harness_recipe import (
    Failure,
    HarnessConfig,
    HarnessRecipe,
    Mutation,
    NothingToProposeError,
    ProposalContext,
    apply_mutations,
)
from reef.recipe.shots import Shot, correction_shot, pick_shots, shots_file
from reef.registry.harness import RULES_FILE, SHOTS_FILE, Harness

_SENTENCE = re.compile(r"(?<=[.!?])\s+")


@dataclass
class HarnessEvolveConfig(HarnessConfig):
    proposer: str = "mined"  # mined | llm
    # mined
    min_support: float = 0.3  # share of failed records whose feedback says a sentence
    min_count: int = 3
    max_rules: int = 2
    max_shots: int = 3  # few-shot examples made from corrections and rewarded replies; 0: none
    # llm
    teacher_url: str | None = None  # an OpenAI-compatible base URL; None: the serving engine
    teacher_model: str | None = None
    teacher_api_key: str | None = None
    max_examples: int = 8
    max_tokens: int = 768
    temperature: float = 0.0
    timeout_s: float = 120.0


def _normal(sentence: str) -> str:
    return " ".join(sentence.split())


def mine_rules(failures: list[Failure], known: str, min_support: float, min_count: int, limit: int) -> list[str]:
    """Feedback sentences said on at least `min_support` of the failed records (and `min_count`),
    most frequent first, leaving out what `known` (the harness's text) says already."""
    said: Counter[str] = Counter()
    spelled: dict[str, str] = {}
    for record_id in {f.record_id for f in failures}:
        sentences = {_normal(s) for f in failures if f.record_id == record_id
                     for s in _SENTENCE.split(f.feedback or "") if _normal(s)}
        for s in sentences:
            said[s.lower()] += 1
            spelled.setdefault(s.lower(), s)
    records = len({f.record_id for f in failures})
    known_lower = known.lower()
    out = [spelled[s] for s, n in sorted(said.items(), key=lambda kv: (-kv[1], kv[0]))
           if n >= min_count and n >= min_support * records and s not in known_lower]
    return out[:limit]


def mined_shots(context: ProposalContext, limit: int) -> Mutation | None:
    """shots.jsonl made of up to `limit` corrections and rewarded replies (reef.recipe.shots), while
    the harness has no examples yet; None when there is nothing to show."""
    if SHOTS_FILE in context.files or limit <= 0:
        return None
    corrected = [correction_shot(f.messages, f.correction) for f in context.failures]
    rewarded = [r.shot() for r in context.rewarded]
    shots = pick_shots([*corrected, *rewarded], limit)
    if not shots:
        return None
    path, content = shots_file(shots)
    return Mutation(op="create", path=path, content=content, reason=_shots_reason(shots, set(rewarded) - {None}))


def _shots_reason(shots: list[Shot], rewarded: set[Shot | None]) -> str:
    from_rewards = sum(1 for s in shots if s in rewarded)
    parts = [f"{from_rewards} rewarded replies"] if from_rewards else []
    parts += [f"{len(shots) - from_rewards} corrections"] if len(shots) > from_rewards else []
    return " and ".join(parts) + " as few-shot examples"


def rules_mutation(files: dict[str, str], rules: list[str], reason: str) -> Mutation:
    """`rules` appended to rules.md as list items (the file created when the harness has none)."""
    lines = "".join(f"- {r}\n" for r in rules)
    if RULES_FILE in files:
        return Mutation(op="update", path=RULES_FILE, content=files[RULES_FILE].rstrip("\n") + "\n" + lines,
                        reason=reason)
    return Mutation(op="create", path=RULES_FILE, content=lines, reason=reason)


_LLM_SYSTEM = """You improve an AI agent's harness: the text files it is served with.
system.md is the system prompt, rules.md holds rules appended to it, skills/<name>/SKILL.md are skills,
examples/ holds few-shot examples. Read the failed replies and their feedback, then change the harness so
the agent does better. Reply with JSON only, no prose:
{"mutations": [{"op": "create" | "update" | "remove", "path": "rules.md", "content": "the whole new text",
  "reason": "why"}]}"""


def llm_prompt(context: ProposalContext, max_examples: int) -> list[dict[str, str]]:
    files = "\n".join(f"=== {path} ===\n{text.rstrip()}" for path, text in sorted(context.files.items()))
    examples = []
    for n, f in enumerate(context.failures[:max_examples], 1):
        user = next((m["content"] for m in reversed(f.messages) if m["role"] == "user"), "")
        examples.append(f"[{n}] user: {user}\n    reply: {f.reply}\n    score: {f.score:g}\n"
                        f"    feedback: {f.feedback or '(none)'}")
    user = (f"Scenario: {context.scenario} ({len(context.failures)} failed replies in {context.records} records; "
            f"the harness is applied as {context.inject}).\n\nCurrent harness:\n{files or '(no files yet)'}\n\n"
            "Failed replies:\n" + "\n".join(examples))
    return [{"role": "system", "content": _LLM_SYSTEM}, {"role": "user", "content": user}]


def parse_mutations(text: str, files: dict[str, str]) -> tuple[list[Mutation], list[str]]:
    """The mutations in a model's reply that validate and fit `files` (in order), and why others did not."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return [], ["the reply holds no JSON object"]
    try:
        data = json.loads(text[start : end + 1])
    except json.JSONDecodeError as exc:
        return [], [f"the reply's JSON does not parse: {exc.msg}"]
    items = data.get("mutations") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return [], ["the reply's JSON has no `mutations` list"]
    kept: list[Mutation] = []
    problems: list[str] = []
    tree = dict(files)
    for item in items:
        try:
            mutation = Mutation.model_validate(item)
            if mutation.op == "create" and mutation.path in tree:
                mutation = mutation.model_copy(update={"op": "update"})  # a model's "create" of what exists
            tree = apply_mutations(tree, [mutation])
        except (ValidationError, ValueError) as exc:
            problems.append(str(exc).splitlines()[0])
            continue
        kept.append(mutation)
    return kept, problems


class HarnessEvolve(HarnessRecipe):
    name = "harness_evolve"
    config_class = HarnessEvolveConfig

    def proposer_name(self) -> str:
        return self.config.proposer  # type: ignore[attr-defined,no-any-return]

    def propose(self, context: ProposalContext) -> list[Mutation]:
        c = self.config
        assert isinstance(c, HarnessEvolveConfig)
        if c.proposer == "mined":
            known = Harness("", context.files).system_prompt()
            rules = mine_rules(context.failures, known, c.min_support, c.min_count, c.max_rules)
            out = [rules_mutation(context.files, rules, f"recurring feedback on {len(context.failures)} "
                                                        "low-reward replies")] if rules else []
            shots = mined_shots(context, c.max_shots)
            return out + ([shots] if shots is not None else [])
        if c.proposer == "llm":
            return self._ask_model(context)
        raise ValueError(f"harness_evolve: proposer must be 'mined' or 'llm', not {c.proposer!r}")

    def _ask_model(self, context: ProposalContext) -> list[Mutation]:
        c = self.config
        assert isinstance(c, HarnessEvolveConfig)
        url, model = c.teacher_url, c.teacher_model
        if url is None and self.engine is not None:
            url, model = self.engine.base_url, model or self.engine.model
        if url is None or model is None:
            raise ValueError("harness_evolve proposer 'llm' needs teacher_url and teacher_model, or a serving "
                             "engine (the learner's)")
        body = chat_body(model, llm_prompt(context, c.max_examples), max_tokens=c.max_tokens,
                         temperature=c.temperature)
        headers = {"Authorization": f"Bearer {c.teacher_api_key}"} if c.teacher_api_key else {}
        base = url.rstrip("/").removesuffix("/v1")
        try:
            with httpx.Client(base_url=base, headers=headers, timeout=c.timeout_s) as client:
                text = chat(client, body).text
        except ChatError as exc:
            detail = exc.problem or f"HTTP {exc.status}"
            raise RuntimeError(f"teacher {model} at {base}: {detail} {exc.text[:200]}") from exc
        mutations, problems = parse_mutations(text, context.files)
        if not mutations:
            raise NothingToProposeError(f"teacher {model} proposed no usable mutation ({'; '.join(problems)}): "
                                        f"{text[:200]!r}")
        return mutations
