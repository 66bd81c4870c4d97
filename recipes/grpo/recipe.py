"""On-policy GRPO through the serving engine: TRL's `GRPOTrainer` with a `rollout_func` that samples
the policy being trained from our running vLLM, for a scenario whose practice tasks already earn
rewards now and then (the ladder's rung after exploration: once successes are not rare, learn from
the failures' contrast too, not only from imitating the successes).

Each generation step, the trainer's current LoRA is saved and loaded into the engine under a
temporary name (reef.sampling.engine, as the gate loads a candidate; unloaded after the step), and
every prompt of the step (TRL repeats each `num_generations` times) gets one sampled reply with its
token ids and behaviour logprobs (reef.sampling.engine_tokens), so the completions are the current
policy's and token-exact. The reward is the scenario's own, on the reply text. Requests yield to
users like every round's (learner.share). Every rollout is written with its provenance in the
candidate folder (`rollouts/`, `source: grpo`), never to the experience store.

What TRL's generation path would do that this does not: tool calls are left to the engine's parser
(vLLM's `hermes` parser) and scored as text; a multi-turn `environment_factory` is not used (a
scenario with an environment is refused, as in explore); there is no guided decoding (a format the
model never writes unasked gets no gradient here: explore's rung comes first for that).

    reef recipe run grpo --set scenario=weather --set kind=lora --engine-url ... --engine-model ...
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets

from reef.recipe import EmptySnapshotError, Recipe, RecipeConfig, Snapshot
from reef.recipe.practice import practice_tasks
from reef.recipe.rollouts import Rollout, rollout_metrics, write_rollouts
from reef.sampling.engine import Arm, EngineSession, run_session
from reef.sampling.engine_tokens import EngineSample, token_samples
from reef.scenario import Task, reward_for

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl import GRPOTrainer

SOURCE = "grpo"


@dataclass
class GRPORecipeConfig(RecipeConfig):
    kind: str = "lora"  # sampled through the engine, which serves adapters on the base weights
    num_generations: int = 4  # replies per prompt: the group its advantages are relative to
    prompts_per_step: int = 2
    temperature: float = 1.0
    max_prompts: int = 64  # practice tasks drawn for the round
    max_new_tokens: int | None = None  # None: the eval suite's max_new_tokens, else 64
    sample_seed: int | None = None
    concurrency: int = 8  # rollout requests in flight (fewer while users wait: learner.share)
    beta: float = 0.0  # no KL term, as in recent GRPO work
    learning_rate: float = 1e-4
    max_steps: int = 16
    min_score: float | None = 1.0  # what counts as a success in the rollouts' metrics


class GRPO(Recipe):
    name = "grpo"
    config_class = GRPORecipeConfig
    stale_policies = ("drop",)
    needs_experience = False  # it samples its own
    waits_for = frozenset({"records"})
    samples_engine = True  # its rollouts: one process samples them (reef.learn.launch)

    def build_trainer(
        self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, output_dir: Path
    ) -> GRPOTrainer:
        from trl import GRPOConfig, GRPOTrainer

        c = self.config
        assert isinstance(c, GRPORecipeConfig)
        scenario = self.scenario()
        if self.engine is None:
            raise ValueError("grpo samples through the serving engine: run it in a round with an engine "
                             "(the learner's, or --engine-url)")
        if scenario.environment is not None:
            raise ValueError(f"scenario {scenario.name!r} has an environment: grpo samples one model turn per task")
        tasks, _ = practice_tasks(scenario, self.served_harness)
        picked = random.Random(c.sample_seed).sample(range(len(tasks)), min(c.max_prompts, len(tasks)))
        self._tasks: dict[int, Task] = {i: tasks[i] for i in picked}
        self._rollouts: list[Rollout] = []
        output_dir.mkdir(parents=True, exist_ok=True)
        self._adapters = Path(tempfile.mkdtemp(prefix="adapters-", dir=output_dir))  # removed with the trainer's folder
        max_tokens = c.max_new_tokens or (scenario.eval.max_new_tokens if scenario.eval else 64)
        reward = reward_for(scenario, self.engine.url, self.engine.model)

        def score(prompts: list[Any], completions: list[Any], task_index: list[int],
                  **_: Any) -> list[float | None]:
            """The scenario's reward on the step's replies (TRL passes the dataset's columns)."""
            step = self._step_samples
            scored = reward([self._tasks[i] for i in task_index], [s.completion.text for s in step])
            values = [s.value for s in scored]
            self._rollouts += [Rollout(i, str(self._tasks[i].get("task_id", i)), False, s, v)
                               for i, s, v in zip(task_index, step, values, strict=True)]
            return values

        def rollout(prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
            indices = [self._index_of(p) for p in prompts]
            self._step_samples = self._sample(trainer, indices, max_tokens)
            return {"prompt_ids": [list(s.completion.prompt_ids) for s in self._step_samples],
                    "completion_ids": [list(s.completion.completion_ids) for s in self._step_samples],
                    "logprobs": [list(s.completion.logprobs or [0.0] * len(s.completion.completion_ids))
                                 for s in self._step_samples]}

        self._keys = {repr(self._tasks[i]["messages"]): i for i in picked}
        dataset = datasets.Dataset.from_list([{"prompt": repr(self._tasks[i]["messages"]), "task_index": i}
                                              for i in picked])
        batch = c.prompts_per_step * c.num_generations
        args = GRPOConfig(**{**self.training_args(output_dir), "per_device_train_batch_size": batch},
                          num_generations=c.num_generations, max_completion_length=max_tokens,
                          temperature=c.temperature, beta=c.beta, remove_unused_columns=False,
                          log_completions=False)
        return GRPOTrainer(model=model, reward_funcs=[score], args=args, train_dataset=dataset,
                           processing_class=tokenizer, rollout_func=rollout)

    def extra_metrics(self, trainer: Any) -> dict[str, Any]:
        c = self.config
        assert isinstance(c, GRPORecipeConfig)
        if not self._rollouts:
            raise EmptySnapshotError("grpo: no rollout came back")
        write_rollouts(Path(trainer.args.output_dir).parent / "rollouts", self._rollouts, [[]] * len(self._rollouts),
                       c.min_score, SOURCE)
        return rollout_metrics(self._rollouts, c.min_score) | {
            "rewarded_steps": sum(1 for row in trainer.state.log_history if row.get("reward", 0) > 0)}

    # --- the steps ------------------------------------------------------------------------------

    def _index_of(self, prompt: Any) -> int:
        # The prompt column is the task's messages as text: TRL keeps a dataset's strings as they are,
        # where a list of messages would be taken for a conversation to template.
        return self._keys[prompt]

    def _sample(self, trainer: GRPOTrainer, indices: list[int], max_tokens: int) -> list[EngineSample]:
        """One reply per prompt from the trainer's current weights, loaded into the engine for the step."""
        c = self.config
        assert isinstance(c, GRPORecipeConfig) and self.engine is not None
        folder = self._adapters / f"step-{trainer.state.global_step}"
        model: Any = trainer.model  # a PeftModel: saves the adapter only
        model.save_pretrained(folder)

        async def body(session: EngineSession) -> list[EngineSample]:
            (name,) = await session.prepare([Arm(adapter=folder)])

            async def one(i: int) -> EngineSample:
                task = self._tasks[i]
                (got,) = await token_samples(session, name, task["messages"], tools=task.get("tools"),
                                             tool_choice=task.get("tool_choice"), n=1, max_tokens=max_tokens,
                                             temperature=c.temperature)
                return got

            return list(await asyncio.gather(*(one(i) for i in indices)))

        return run_session(self.engine, c.concurrency, body)

