"""Per-step training metrics of a round (loss, reward, KL, grad norm, learning rate, ...), kept with
the candidate: as `training_log` in candidate.json (what the dashboard plots) and as TensorBoard
event files in the candidate's `tensorboard/` folder (`tensorboard --logdir data/candidates`).

Trainer-based recipes log through transformers' own `report_to=["tensorboard"]` and their
`trainer.state.log_history`; recipes with their own loop (ttt, self_play) call `TrainingLog.log`
once per optimizer step, which writes the same rows and the same TensorBoard tags (`train/<key>`).
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path
from typing import Any

RUNS = "runs"  # where transformers' TensorBoardCallback writes under a Trainer's output_dir
CANDIDATE_DIR = "tensorboard"  # reef.registry.artifacts.TRAINING_EVENTS_DIR: left out of the artifact
# Rows of trainer.state.log_history that summarise the run rather than a step: in metrics already.
_SUMMARY_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos"}


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def per_step(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A Trainer's log history without its end-of-run summary row, numbers only."""
    return [{k: v for k, v in row.items() if _number(v)} for row in log_history if not _SUMMARY_KEYS & set(row)]


class TrainingLog:
    """The per-step rows of a recipe's own training loop, mirrored to TensorBoard when installed."""

    def __init__(self, output_dir: Path | None = None) -> None:
        """`output_dir`: a Trainer-style output folder for the TensorBoard events (None: rows only)."""
        self.rows: list[dict[str, Any]] = []
        self._dir = output_dir / RUNS / "loop" if output_dir is not None else None
        self._writer: Any = None

    def log(self, step: int, **values: Any) -> None:
        row = {"step": step, **{k: float(v) for k, v in values.items() if _number(v)}}
        self.rows.append(row)
        if self._writer is None and self._dir is not None and tensorboard_available():
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self._dir))
        if self._writer is not None:
            for key, value in row.items():
                if key != "step":
                    self._writer.add_scalar(f"train/{key}", value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def keep_events(trainer_dir: Path, candidate_dir: Path) -> None:
    """Move the round's TensorBoard event files (Trainer's or a loop's) into the candidate folder."""
    runs = trainer_dir / RUNS
    if runs.is_dir() and any(runs.rglob("events.out.tfevents.*")):
        shutil.move(str(runs), str(candidate_dir / CANDIDATE_DIR))
