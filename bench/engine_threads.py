"""The engine's CPU threads beside training, side by side: users' latency on an engine whose OpenMP
team fills every core against one that leaves a core over (`engine.cpu_threads`, Reef's default),
each with nobody else on the machine and beside a niced LoRA training loop (what a learning round
runs), and the training loop's pace alone and beside each engine's users.

    .venv/bin/python bench/engine_threads.py [--rounds 4] [--users 4] [--seconds 20] [--threads all,default]

Both engines (SmolLM2-135M-Instruct, LoRA enabled, as `reef serve` starts them) are started first;
then each round measures, in turn: the trainer alone; and for each engine its users alone and its
users beside the trainer (a separate process at nice 10 with OMP_NUM_THREADS=1, as
`learner.round_nice` runs a round: LoRA on every projection of the same model, batches of 8 x 48
tokens). Users are closed loops of short chats (16 tokens, greedy). Figures are medians over rounds:
users' p50 and p95, their ratio to the same engine's users alone, and training steps per second.
Results: bench/RESULTS.md (`engine_threads`).
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import httpx  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402
from reef.config import DEFAULT_MODEL, EngineConfig, ServeConfig  # noqa: E402
from reef.engine.supervisor import EngineSupervisor  # noqa: E402

console = Console()
SERVED = "bench-base"
PROMPTS = ["What is the capital of France?", "Name three primary colours.", "What is 7 + 5?",
           "Why is the sky blue?", "List four planets.", "What is a prime number?"]

# The trainer: a LoRA step loop on the served model, printing one line per step.
TRAINER = """
import sys, time, torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
model = get_peft_model(AutoModelForCausalLM.from_pretrained(sys.argv[1]), LoraConfig(
    r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
x = torch.randint(0, 1000, (8, 48))
print("ready", flush=True)
while True:
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad()
    print(time.monotonic(), flush=True)
"""


class Trainer:
    """The training loop in its own niced process; counts its steps from a start mark."""

    def __init__(self, model: Path) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", TRAINER, str(model)], stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=lambda: os.nice(10))
        self.steps: list[float] = []
        self.paused = threading.Event()
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            raise SystemExit("the trainer did not start")
        threading.Thread(target=self._read, daemon=True).start()
        self.pause()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.steps.append(float(line))

    def pause(self) -> None:
        os.kill(self.process.pid, 19)  # SIGSTOP: between arms the trainer takes no CPU

    def resume(self) -> None:
        os.kill(self.process.pid, 18)  # SIGCONT

    def rate(self, start: float, end: float) -> float:
        return sum(start <= t < end for t in self.steps) / (end - start)

    def stop(self) -> None:
        self.resume()
        self.process.kill()
        self.process.wait()


def users(url: str, n: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    end = time.monotonic() + seconds

    def one(i: int) -> None:
        with httpx.Client(timeout=300) as client:
            while time.monotonic() < end:
                t = time.monotonic()
                client.post(f"{url}/v1/chat/completions", json={
                    "model": SERVED, "max_tokens": 16, "temperature": 0,
                    "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]}).raise_for_status()
                latencies.append(time.monotonic() - t)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", default="all,default", help="engines: all (every core), default (Reef's), or N")
    add_flag(parser)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="engine-threads-"))
    engines: dict[str, tuple[EngineSupervisor, str]] = {}
    for name in args.threads.split(","):
        threads = cores if name == "all" else None if name == "default" else int(name)
        config = ServeConfig(model=str(DEFAULT_MODEL), served_model_name=SERVED, data_dir=work / name / "data",
                             engine=EngineConfig(cpu_threads=threads))
        supervisor = EngineSupervisor(config, work / f"vllm-{name}.log")
        label = f"{name} ({supervisor.cpu_threads} of {cores} cores)"
        engines[label] = (supervisor, supervisor.start())
        console.print(f"engine {label} up")
    trainer = Trainer(DEFAULT_MODEL)
    rows: dict[str, dict[str, list[float]]] = {label: {} for label in engines}
    alone: list[float] = []
    try:
        for r in range(args.rounds):
            trainer.resume()
            t0 = time.monotonic()
            time.sleep(args.seconds)
            alone.append(trainer.rate(t0, time.monotonic()))
            trainer.pause()
            for label, (_, url) in engines.items():
                for arm in ("alone", "beside training"):
                    if arm != "alone":
                        trainer.resume()
                    t0 = time.monotonic()
                    lat = users(url, args.users, args.seconds)
                    got = rows[label]
                    got.setdefault(f"{arm} p50", []).append(statistics.median(lat))
                    got.setdefault(f"{arm} p95", []).append(pct(lat, 0.95))
                    if arm != "alone":
                        got.setdefault("steps/s", []).append(trainer.rate(t0, time.monotonic()))
                        trainer.pause()
                        got.setdefault("ratio", []).append(got["beside training p50"][-1] / got["alone p50"][-1])
                    console.print(f"round {r} {label} {arm}: p50 {statistics.median(lat):.2f} s, {len(lat)} chats")
    finally:
        trainer.stop()
        for supervisor, _ in engines.values():
            supervisor.stop()
    med = statistics.median
    table = Table(title=f"users' chats ({args.users} users, 16 tokens) on an engine beside a niced LoRA trainer, "
                  f"medians of {args.rounds} rounds; trainer alone {med(alone):.2f} steps/s")
    for column in ("engine threads", "users alone p50 / p95 s", "beside training p50 / p95 s", "p50 beside / alone",
                   "training steps/s beside", "training pace vs alone"):
        table.add_column(column, justify="right")
    for label, got in rows.items():
        table.add_row(label, f"{med(got['alone p50']):.2f} / {med(got['alone p95']):.2f}",
                      f"{med(got['beside training p50']):.2f} / {med(got['beside training p95']):.2f}",
                      f"{med(got['ratio']):.2f}x", f"{med(got['steps/s']):.2f}",
                      f"{med(got['steps/s']) / med(alone):.2f}x")
    console.print(table)
    load = os.getloadavg()[0]
    note = (f"Load average (1 min) at the end: {load:.1f}. The trainer is SIGSTOPped between arms, so each arm "
            "sees only its own load and the machine's.")
    console.print(note)
    publish(args, "engine_threads", table, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
