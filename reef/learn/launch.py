"""A round's training through Hugging Face accelerate (`learner.launcher: accelerate`, `reef recipe
run --launcher accelerate`): the same TRL recipe in every process accelerate starts, each training
on its share of every batch with gradients synchronised by torch.distributed (DDP over gloo on CPU,
NCCL on GPUs; FSDP or DeepSpeed from an accelerate config file), so one recipe trains on one
process, a multi-GPU box or a cluster. Only the main process (rank 0) writes the candidate, its
lineage and the consumed ledger (reef.recipe.base.Recipe.run), once.

The round process starts `accelerate launch ... -m reef.learn.launch --plan P --snapshot S --out O`
and waits; the main process writes where the candidate is to O. Without a config file the launch is
one machine of `num_processes` processes (`--multi_gpu`, which on a machine without GPUs is DDP
over gloo on the CPU). A recipe that samples the serving engine (`Recipe.samples_engine`: explore,
grpo) or trains no weights (a harness) trains in the round process instead: several processes would
each sample their own rollouts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from reef.config.learner import AccelerateSettings
from reef.core.paths import DataDir
from reef.engine.supervisor import free_port
from reef.learn.plan import RoundPlan
from reef.recipe.base import Recipe, main_process
from reef.recipe.snapshot import Snapshot
from reef.registry.schema import Candidate


class LaunchError(RuntimeError):
    """The launched training failed (its output is in the round's log)."""


def launches(recipe: Recipe) -> bool:
    """Whether accelerate may train this recipe: weights, and no rollouts of its own."""
    return recipe.config.kind in ("lora", "full") and not recipe.samples_engine


def accelerate_command(settings: AccelerateSettings, worker_args: list[str]) -> list[str]:
    """`accelerate launch` of this module's worker with `worker_args`."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if settings.config_file is not None:
        cmd += ["--config_file", str(settings.config_file)]
    else:
        several = ["--multi_gpu"] if settings.num_processes > 1 else []
        cmd += [*several, "--num_processes", str(settings.num_processes), "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd += ["--main_process_port", str(settings.main_process_port or free_port())]
    return [*cmd, "-m", "reef.learn.launch", *worker_args]


def launch_training(plan: RoundPlan, snapshot: Snapshot, settings: AccelerateSettings) -> Candidate:
    """Train `plan`'s recipe on `snapshot` through accelerate; the candidate its main process wrote."""
    folder = DataDir(plan.data_dir).learner(plan.scenario) / "launch"
    folder.mkdir(parents=True, exist_ok=True)
    plan_file, out = folder / "plan.json", folder / "candidate.json"
    plan_file.write_text(plan.model_dump_json(indent=2))
    out.unlink(missing_ok=True)
    cmd = accelerate_command(settings, ["--plan", str(plan_file), "--snapshot", str(snapshot.path),
                                        "--out", str(out)])
    print(f"launching: {' '.join(cmd)}", file=sys.stderr, flush=True)
    code = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
                          check=False).returncode
    if code != 0 or not out.is_file():
        raise LaunchError(f"accelerate launch of {plan.recipe} exited with code {code} "
                          f"({'no candidate written' if not out.is_file() else 'after writing its candidate'})")
    return Candidate.read(Path(json.loads(out.read_text())["path"]))


def main(argv: list[str] | None = None) -> int:
    """One launched process: train on its share; the main one writes where the candidate is."""
    parser = argparse.ArgumentParser(prog="python -m reef.learn.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="a RoundPlan as JSON, its head already applied")
    parser.add_argument("--snapshot", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    plan = RoundPlan.model_validate_json(args.plan.read_text())
    recipe = plan.load_recipe()
    candidate = recipe.run(Snapshot.open(args.snapshot), out_root=plan.candidate_root, out_dir=plan.candidate_dir,
                           progress=False)
    if main_process():
        args.out.write_text(json.dumps({"path": str(candidate.path)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
