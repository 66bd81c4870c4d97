"""`make bench`: every bench that writes a section of bench/RESULTS.md, one after another, then which
sections were regenerated and how long each bench took.

    .venv/bin/python bench/run.py [--only ingest,swap] [--skip faults] [--list]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import RESULTS, section  # noqa: E402

# Section name -> the command that writes it, in the file's order. A bench that fails (faults' disk
# row needs root or sudo) leaves its section as it was and the rest still run.
BENCHES: dict[str, list[str]] = {
    "ingest": ["bench/ingest.py"],
    "gateway_overhead_stand_in": ["bench/gateway_overhead.py", "--stand-in-only"],
    "gateway_overhead": ["bench/gateway_overhead.py"],
    "dialect_json": ["bench/dialect_json.py"],
    "recipe_overhead": ["bench/recipe_overhead.py"],
    "swap": ["bench/swap.py"],
    "gate": ["bench/gate.py"],
    "harness": ["bench/harness.py"],
    "dashboard": ["bench/dashboard.py"],
    "cpu_lora_fix": ["bench/cpu_lora_fix.py"],
    "engine_speed": ["bench/engine_speed.py"],
    "engine_threads": ["bench/engine_threads.py"],
    "lora_ops": ["bench/lora_ops.py", "--against", "edd4b4e"],
    "learning": ["bench/learning.py", "--examples", "sentiment,reviews,shop,orders"],
    "learning_tiny": ["bench/learning_tiny.py", "--scenarios", "demo-add"],
    "learning_online_rl": ["bench/learning_tiny.py", "--scenarios", "demo-add", "--recipe", "online_rl",
                           "--param", "max_steps=60", "--no-next-turn"],
    "online_rl_sweep": ["bench/online_rl_sweep.py"],
    "rl_compare": ["bench/rl_compare.py", "--example", "capitals", "--prompts", "32", "--generations", "8",
                   "--seeds", "3"],
    "faults": ["bench/faults.py"],
}


def names(value: str) -> list[str]:
    chosen = [n.strip() for n in value.split(",") if n.strip()]
    unknown = sorted(set(chosen) - set(BENCHES))
    if unknown:
        raise argparse.ArgumentTypeError(f"no such section: {', '.join(unknown)} (known: {', '.join(BENCHES)})")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", type=names, default=list(BENCHES), help="comma-separated sections to regenerate")
    parser.add_argument("--skip", type=names, default=[], help="comma-separated sections to leave as they are")
    parser.add_argument("--list", action="store_true", help="print each section's command and exit")
    args = parser.parse_args(argv)
    chosen = [n for n in BENCHES if n in args.only and n not in args.skip]
    if args.list:
        for name in chosen:
            print(f"{name:28} python {' '.join(BENCHES[name])}")
        return 0
    done: list[tuple[str, float, int, bool]] = []
    for name in chosen:
        print(f"\n=== {name}: python {' '.join(BENCHES[name])}", flush=True)
        before, started = section(name), time.monotonic()
        # The bench's own exit status: gate.py's is 1 when its target is missed, figures written all the same.
        rc = subprocess.run([sys.executable, *BENCHES[name]], cwd=REPO).returncode
        done.append((name, time.monotonic() - started, rc, section(name) not in (None, before)))
    print(f"\n{RESULTS.relative_to(REPO)}:")
    for name, seconds, rc, regenerated in done:
        print(f"  {name:28} {'regenerated' if regenerated else 'NOT regenerated':16} {seconds / 60:6.1f} min"
              + ("" if rc == 0 else f"  (exit status {rc})"))
    return 0 if all(regenerated for *_, regenerated in done) else 1


if __name__ == "__main__":
    sys.exit(main())
