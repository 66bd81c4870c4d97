"""The `Recipe` base class: a recipe builds a trainer; the framework does everything around it.

A recipe subclass sets `name` and `config_class`, may adjust `experience()`, and implements
`build_trainer()`, or overrides `fit()` when its training is not one `Trainer.train()` call (a
sample -> score -> update loop). A recipe that makes its own experience (test-time training,
self-play) sets `needs_experience = False`: its spec takes no records (`batch_size` 0) and it runs
on an empty snapshot, which still pins the scenario and head release for lineage; its problems
and reward come from the declared scenario (`recipe.scenario()`: tasks, reward, eval suite).

`run(snapshot)` loads the base model (wrapped in LoRA when `kind: lora`), trains with a progress
bar, keeps the per-step training metrics (`self.training_log`: a Trainer's log history, or the
rows a custom `fit()` logs with `self.training_log.log(step, ...)`), saves a candidate vLLM can
load (full weights with the base model's tokenizer files, or a PEFT adapter), writes
`candidate.json` (metrics, per-step log, lineage) and marks the snapshot's records consumed.
The same call runs in a notebook, the CLI and the DVC train stage.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import uuid
from abc import ABC
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from reef.core.durable import replace_dir
from reef.core.hashing import sha256_json, weights_sha256
from reef.core.paths import DataDir
from reef.recipe import ledger
from reef.recipe.config import RecipeConfig
from reef.recipe.snapshot import EmptySnapshotError, ExperienceSpec, Snapshot
from reef.recipe.training_log import TrainingLog, keep_events, per_step, tensorboard_available
from reef.registry.schema import Candidate, Lineage
from reef.scenario import Scenario, get_scenario

if TYPE_CHECKING:
    import datasets
    import transformers
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from reef.registry.harness import Harness
    from reef.sampling.engine import EngineEndpoint

log = logging.getLogger(__name__)

DEFAULT_CANDIDATES = DataDir().candidates()
# Base-model files that are weights or Reef's build metadata: a full candidate writes its own.
_NOT_COPIED = {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "reef-model.json"}


def _versions() -> dict[str, str]:
    out = {}
    for pkg in ("torch", "transformers", "trl", "peft"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def git_commit(cwd: Path | str = ".") -> str:
    """HEAD of the repository at `cwd` (the project whose recipes and params ran), suffixed
    "+dirty" when tracked files differ from it; "unknown" outside a git repository."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def check_adapter_base(adapter: Path, base_model: str) -> None:
    """An adapter trained on other base weights would silently mean something else on these."""
    if not (adapter / "adapter_config.json").is_file():
        raise ValueError(f"init_adapter {adapter} holds no adapter_config.json (not a LoRA adapter)")
    candidate = Candidate.read_if_any(adapter)
    if candidate is not None:
        expected, actual = candidate.lineage.base_model_sha256, weights_sha256(base_model)
        if expected and actual and expected != actual:
            raise ValueError(f"init_adapter {adapter} was trained on base weights {expected[:12]}, "
                             f"not on {base_model} ({actual[:12]})")


def main_process() -> bool:
    """Whether this process writes what a run makes: every process but ranks 1.. of a launch over
    several (torchrun and accelerate set RANK; a plain process has none)."""
    return int(os.environ.get("RANK", "0")) == 0


def longest_example(dataset: datasets.Dataset) -> int:
    """Tokens of the longest training example: `input_ids`, or a prompt and its completion."""
    if "input_ids" in dataset.column_names:
        return max((len(ids) for ids in dataset["input_ids"]), default=0)
    pairs = zip(dataset["prompt_ids"], dataset["completion_ids"], strict=True)
    return max((len(p) + len(c) for p, c in pairs), default=0)


class Recipe(ABC):
    name: ClassVar[str]
    config_class: ClassVar[type[RecipeConfig]] = RecipeConfig
    # Declarations about the experience a recipe can learn from (see ExperienceSpec).
    needs_reports: ClassVar[bool] = True
    min_group_size: ClassVar[int] = 1
    stale_policies: ClassVar[tuple[str, ...]] = ("drop", "downweight")
    # False: the recipe generates its own samples and takes no recorded traffic.
    needs_experience: ClassVar[bool] = True
    # What a learner round waits for (reef.learn.plan.thresholds): eligible "records", "rewarded"
    # and "unrewarded" ones (see success_threshold), each up to learner.min_<count> or the recipe
    # setting's. A count left out is not waited for unless the recipe setting names it.
    waits_for: ClassVar[frozenset[str]] = frozenset({"records", "rewarded", "unrewarded"})
    # The serving engine (vLLM's OpenAI server and base-model name), for recipes that ask a model
    # (harness_evolve's llm proposer); the round sets it when it has one.
    engine: EngineEndpoint | None = None
    # The head release's harness where the gateway applies it (`harness.inject` not off): served
    # prompts carry it, so a recipe that samples prompts of its own (practice tasks) sends them with
    # it (reef.recipe.practice); the round sets it.
    served_harness: Harness | None = None
    # True: `fit` samples the serving engine (rollouts). Launched over several processes
    # (learner.launcher: accelerate) each would sample its own, so such a recipe trains in one.
    samples_engine: ClassVar[bool] = False

    def __init__(self, config: RecipeConfig | None = None, *, declared: Scenario | None = None, **params: Any) -> None:
        if config is not None and params:
            raise TypeError("pass a config or params, not both")
        if config is None and declared is not None and declared.name and "scenario" not in params:
            params["scenario"] = declared.name
        self.config = config if config is not None else self.config_class.from_dict(params)
        if declared is not None and declared.name and declared.name != self.config.scenario:
            raise ValueError(f"scenario {declared.name!r} given for a recipe configured for {self.config.scenario!r}")
        self._scenario = declared
        self.training_log = TrainingLog()
        if not isinstance(self.config, self.config_class):
            raise TypeError(f"{type(self).__name__} takes a {self.config_class.__name__}")
        if self.config.stale_policy not in self.stale_policies:
            raise ValueError(
                f"{self.name} supports stale_policy {self.stale_policies}, not {self.config.stale_policy!r}"
            )

    def scenario(self) -> Scenario:
        """The declared scenario this recipe learns for (its tasks, reward, eval suite): `declared=`
        given to the constructor, else `config.scenario` as installed packages and ./serve.yaml declare it."""
        if self._scenario is None:
            from reef.config import resolve

            config, _ = resolve()
            self._scenario = get_scenario(self.config.scenario, config)
        return self._scenario

    def success_threshold(self) -> float | None:
        """The reward at or above which a record counts as rewarded when a round waits for signal;
        None: any reward above 0 (the others, 0 or below, are unrewarded)."""
        return self.config.min_score

    @property
    def ref(self) -> str:
        return f"{type(self).__module__}:{type(self).__qualname__}"

    def experience(self) -> ExperienceSpec:
        c = self.config
        takes = self.needs_experience
        return ExperienceSpec(
            scenario=c.scenario, needs_reports=self.needs_reports and takes, group_by=c.group_by,
            min_group_size=self.min_group_size, max_staleness=c.max_staleness, stale_policy=c.stale_policy,
            stale_weight=c.stale_weight, batch_size=c.batch_size if takes else 0, min_score=c.min_score,
            drop_duplicates=c.drop_duplicates,
        )

    def build_trainer(
        self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, output_dir: Path
    ) -> transformers.Trainer:
        """A ready-to-train `Trainer` over `snapshot` (built from its recorded token ids)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither build_trainer() nor fit()")

    def fit(
        self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, output_dir: Path
    ) -> tuple[PreTrainedModel, dict[str, Any]]:
        """Train; returns the trained model (what gets saved) and metrics for candidate.json."""
        trainer = self.build_trainer(snapshot, model, tokenizer, output_dir)
        if not getattr(self, "_progress", True):
            import transformers

            # The per-step log dicts go to candidate.json and TensorBoard, not to stdout.
            trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
        result = trainer.train()
        self.training_log.rows = per_step(trainer.state.log_history)
        batching = {"micro_batch": trainer.args.per_device_train_batch_size,
                    "gradient_accumulation_steps": trainer.args.gradient_accumulation_steps}
        return cast("PreTrainedModel", trainer.model), {**result.metrics, **batching, **self.extra_metrics(trainer)}

    def extra_metrics(self, trainer: transformers.Trainer) -> dict[str, Any]:
        """Recipe-specific numbers for candidate.json (e.g. how many samples were used)."""
        return {}

    # --- helpers for subclasses ---------------------------------------------------------------

    def training_args(self, output_dir: Path, dataset: datasets.Dataset | None = None) -> dict[str, Any]:
        """TrainingArguments every recipe shares: CPU-safe, no checkpoints, no trackers. With the
        training `dataset`, micro-batches fit `max_batch_tokens`."""
        import torch

        c = self.config
        progress = getattr(self, "_progress", True)
        steps = c.max_steps if c.max_steps > 0 else -1
        micro, accumulate = c.micro_batch(longest_example(dataset) if dataset is not None else 0)
        return dict(
            output_dir=str(output_dir), max_steps=steps, num_train_epochs=c.epochs, learning_rate=c.learning_rate,
            per_device_train_batch_size=micro, gradient_accumulation_steps=accumulate, seed=c.seed, data_seed=c.seed,
            # TRL defaults bf16 and gradient checkpointing on; on CPU both only cost time.
            use_cpu=not torch.cuda.is_available(), bf16=False, gradient_checkpointing=False,
            # Every step logged: the candidate keeps the curves (reef.recipe.training_log).
            logging_steps=1, save_strategy="no", report_to=["tensorboard"] if tensorboard_available() else [],
            disable_tqdm=not progress, dataloader_num_workers=0, lr_scheduler_type="constant_with_warmup",
            warmup_steps=0,
        )

    def load_model(self) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        """The base model; with `kind: lora`, wrapped in a fresh adapter, or in `init_adapter` (e.g. the
        head release's adapter) loaded trainable, so that a round continues where the head left off."""
        from reef.sampling.load import load_model

        c = self.config
        if c.init_adapter is not None:
            if c.kind != "lora":
                raise ValueError(f"init_adapter is for kind: lora; a {c.kind} candidate starts from base_model")
            check_adapter_base(Path(c.init_adapter), c.base_model)
        model, tokenizer = load_model(c.base_model, c.init_adapter, trainable=True)
        if c.init_adapter is None and c.kind == "lora":
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=c.lora_r, lora_alpha=c.lora_alpha, lora_dropout=c.lora_dropout,
                              target_modules=list(c.lora_target_modules), task_type="CAUSAL_LM")
            model = cast("PreTrainedModel", get_peft_model(model, lora))  # a PeftModel forwards to its model
        return model, tokenizer

    # --- the framework's part ----------------------------------------------------------------

    def candidate_id(self, snapshot: Snapshot, base_sha: str | None) -> str:
        key = sha256_json([snapshot.hash, self.ref, self.config.to_dict(), base_sha])
        return f"{snapshot.scenario}-{key[:12]}"

    def run(
        self,
        snapshot: Snapshot | Path | str,
        out_root: Path | str = DEFAULT_CANDIDATES,
        *,
        out_dir: Path | str | None = None,
        progress: bool = True,
        consume: bool = True,
    ) -> Candidate:
        """Train on `snapshot` and write the candidate to `out_dir` or `<out_root>/<candidate id>/`.

        Launched over several processes (accelerate, torchrun: reef.learn.launch), every process
        trains its share of the batch and only the main one (rank 0) writes the candidate and marks
        the records consumed; the others return the candidate unwritten."""
        import datasets
        import torch
        import transformers

        snap = snapshot if isinstance(snapshot, Snapshot) else Snapshot.open(snapshot)
        self._progress = progress
        if snap.spec != self.experience():
            raise ValueError(f"snapshot {snap.id} was taken with {snap.spec}, but {self.name} declares "
                             f"{self.experience()}; take a snapshot with recipe.experience()")
        if not snap.record_ids and self.needs_experience:
            raise EmptySnapshotError(f"snapshot {snap.id} has no records")
        ledger.check_unconsumed(snap.ledger_root, snap.scenario, snap.hash, snap.record_ids)

        base_sha = weights_sha256(self.config.base_model)
        cand_id = self.candidate_id(snap, base_sha)
        target = Path(out_dir) if out_dir is not None else Path(out_root) / cand_id
        staging = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        threads = torch.get_num_threads()
        bars = datasets.is_progress_bar_enabled(), transformers.utils.logging.is_progress_bar_enabled()
        if not progress:
            datasets.disable_progress_bars()
            transformers.utils.logging.disable_progress_bar()
        # One thread: for models this small, a second one makes the many tiny ops slower.
        torch.set_num_threads(int(os.environ.get("REEF_TRAIN_THREADS", "1")))
        try:
            transformers.set_seed(self.config.seed)
            model, tokenizer = self.load_model()
            self.training_log = TrainingLog(staging / ".trainer")
            try:
                trained, fitted = self.fit(snap, model, tokenizer, staging / ".trainer")
            finally:
                self.training_log.close()
            staging.mkdir(parents=True, exist_ok=True)
            keep_events(staging / ".trainer", staging)
            shutil.rmtree(staging / ".trainer", ignore_errors=True)
            if main_process():
                self._save(trained, staging)
            metrics = {**fitted, "snapshot_records": len(snap.record_ids), "snapshot_counts": snap.manifest["counts"],
                       "processes": int(os.environ.get("WORLD_SIZE", "1"))}
            lineage = Lineage(
                snapshot_id=snap.id, snapshot_hash=snap.hash, recipe=self.ref, params=self.config.to_dict(),
                parent_release=snap.head_release, code_commit=git_commit(), base_model=self.config.base_model,
                base_model_sha256=base_sha, versions=_versions(),
            )
            candidate = Candidate(id=cand_id, path=target, kind=self.config.kind, scenario=snap.scenario,
                                  metrics=metrics, lineage=lineage, created_at=datetime.now(UTC).isoformat(),
                                  training_log=self.training_log.rows)
            if not main_process():
                return candidate  # the main process writes it
            candidate.write(staging)
            replace_dir(staging, target)  # synced, and swapped in whole: never deleted first
        finally:
            torch.set_num_threads(threads)
            if bars[0]:
                datasets.enable_progress_bars()
            if bars[1]:
                transformers.utils.logging.enable_progress_bar()
            shutil.rmtree(staging, ignore_errors=True)
        if consume:
            ledger.mark_consumed(snap.ledger_root, snap.scenario, snap.hash, snap.record_ids, cand_id)
        candidate = Candidate.read(target)
        if progress:
            loss = metrics.get("train_loss")
            print(f"candidate {cand_id} ({self.name}, {self.config.kind}) -> {target}; "
                  f"{len(snap.record_ids)} records, train_loss {loss}", file=sys.stderr)
        return candidate

    def _save(self, model: PreTrainedModel, out: Path) -> None:
        if self.config.kind == "lora":
            model.save_pretrained(out)  # the adapter only: vLLM serves it on the base model
            return
        for item in Path(self.config.base_model).iterdir():
            if item.is_file() and item.name not in _NOT_COPIED:
                shutil.copy2(item, out / item.name)  # the exact tokenizer files the base model served with
        model.save_pretrained(out)
