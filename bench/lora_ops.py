"""What the LoRA ops cost the CPU engine per decode step, Reef's grouped ops against vLLM's own torch
ops, for batches that mix base-model users with a few adapter sequences (a gate or a canary beside
users), side by side in alternating rounds.

    .venv/bin/python bench/lora_ops.py [--rounds 7] [--against <git rev>]

One "step" is what SmolLM2-135M-Instruct's 30 layers call on a decode step with LoRA enabled: per
layer, q/k/v shrink and expand-slice, o shrink and expand, gate/up shrink and expand-slice, down
shrink and expand (14 calls; rank 16, 4 adapter slots), on one thread (the engine's own on 2 cores,
`engine.cpu_threads`). CPU time (process_time), median over rounds. vLLM's ops give base-model
tokens the last slot's adapter on CPU (vllm#48421, what reef/engine/cpu_lora_fix.py mends): their
timing is shown, not their answers. `--against REV` adds Reef's ops as they were at a git revision.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402

HIDDEN, INTERMEDIATE, KV, RANK, SLOTS, LAYERS = 576, 1536, 192, 16, 4, 30
# Decode batches: which adapter slot each token uses (-1: the base model).
LAYOUTS = {
    "4 users + 2 adapter sequences": [-1] * 4 + [0] * 2,
    "16 users + 4 adapter sequences": [-1] * 16 + [1] * 4,
    "adapter sequences between users": [-1, 0, -1, -1, 0, -1],
    "16 adapter sequences": [0] * 16,
    "6 users, no adapter": [-1] * 6,
}


def load_ops(source: Path | str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def step(ops: ModuleType, indices: list[int]) -> Callable[[], None]:
    """One decode step's LoRA calls (all layers) for the batch `indices`."""
    n, idx = len(indices), torch.tensor(indices)
    a = {k: torch.randn(SLOTS, 1, RANK, k) for k in (HIDDEN, INTERMEDIATE)}
    b = {k: torch.randn(SLOTS, 1, k, RANK) for k in (HIDDEN, KV, INTERMEDIATE)}
    x = {k: torch.randn(n, k) for k in (HIDDEN, INTERMEDIATE)}
    buf, h = torch.zeros(n, RANK), torch.randn(n, RANK)
    out = {k: torch.zeros(n, k) for k in (HIDDEN + 2 * KV, HIDDEN, 2 * INTERMEDIATE)}

    def run() -> None:
        for _ in range(LAYERS):
            for _ in range(3):  # q, k, v
                ops.bgmv_shrink(x[HIDDEN], a[HIDDEN], buf, idx, 1.0)
            offset = 0
            for width in (HIDDEN, KV, KV):
                ops.bgmv_expand_slice(h, b[width], out[HIDDEN + 2 * KV], idx, offset, width, True)
                offset += width
            ops.bgmv_shrink(x[HIDDEN], a[HIDDEN], buf, idx, 1.0)  # o
            ops.bgmv_expand(h, b[HIDDEN], out[HIDDEN], idx, True)
            for offset in (0, INTERMEDIATE):  # gate, up
                ops.bgmv_shrink(x[HIDDEN], a[HIDDEN], buf, idx, 1.0)
                ops.bgmv_expand_slice(h, b[INTERMEDIATE], out[2 * INTERMEDIATE], idx, offset, INTERMEDIATE, True)
            ops.bgmv_shrink(x[INTERMEDIATE], a[INTERMEDIATE], buf, idx, 1.0)  # down
            ops.bgmv_expand(h, b[HIDDEN], out[HIDDEN], idx, True)

    return run


def cpu_ms(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm: caches, allocator
    t0 = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - t0) / repeats * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5, help="steps timed per arm and round")
    parser.add_argument("--against", metavar="REV", help="also Reef's ops at this git revision")
    add_flag(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    console = Console()

    import vllm.lora.ops.torch_ops.lora_ops as vllm_ops  # before anything registers Reef's plugin

    arms: dict[str, ModuleType] = {"vLLM's torch ops": vllm_ops,
                                   "Reef's grouped ops": load_ops(REPO / "reef/engine/cpu_lora_fix.py", "reef_ops")}
    if args.against:
        old = subprocess.run(["git", "show", f"{args.against}:reef/engine/cpu_lora_fix.py"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
        path = Path(tempfile.mkdtemp()) / "cpu_lora_fix_old.py"
        path.write_text(old)
        arms[f"Reef's ops at {args.against}"] = load_ops(path, "reef_ops_old")
    steps = {(layout, arm): step(ops, idx) for layout, idx in LAYOUTS.items() for arm, ops in arms.items()}
    got: dict[tuple[str, str], list[float]] = {key: [] for key in steps}
    for r in range(args.rounds):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))  # alternate: drift hits every arm alike
        for key in order:
            got[key].append(cpu_ms(steps[key], args.repeats))
        console.print(f"round {r + 1}/{args.rounds} done")

    med = statistics.median
    table = Table(title=f"LoRA ops' CPU ms per decode step (SmolLM2-135M's {LAYERS} layers x 14 calls, rank {RANK}, "
                  f"1 thread), median of {args.rounds} alternating rounds")
    table.add_column("batch", justify="left")
    for arm in arms:
        table.add_column(arm, justify="right")
    lead = "Reef's grouped ops"
    for other in arms:
        if other != lead:
            table.add_column(f"Reef / {other}", justify="right")
    for layout in LAYOUTS:
        cells = [f"{med(got[layout, arm]):.2f}" for arm in arms]
        ratios = [f"{med(got[layout, lead]) / med(got[layout, other]):.2f}x" for other in arms if other != lead]
        table.add_row(layout, *cells, *ratios)
    console.print(table)
    publish(args, "lora_ops", table, __doc__.split("\n\n")[2].replace("\n", " ") if __doc__ else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
