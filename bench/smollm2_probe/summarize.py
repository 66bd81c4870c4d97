"""Print the result lines of all logs (baseline rates, learning curves, final results).

    cd /work/rm/bench/smollm2_probe && /work/main/.venv/bin/python summarize.py
"""

import glob
import json
import re

for f in sorted(glob.glob("logs/*.log")):
    if "aborted" in f:
        continue
    print(f"== {f}")
    for line in open(f):
        if re.search(r"success|\[eval|RESULT|training examples|step +1 |step +\d+ ", line) and \
                "stats.append" not in line:
            print("  " + line.rstrip()[:230])
for f in sorted(glob.glob("results/rft_*.json")):
    r = json.load(open(f))
    if "heldout_greedy" in r:
        print(f"{f}: greedy {r['heldout_greedy']:.3f} T1 {r['heldout_t1']:.3f} train {r['train_wall_s']:.0f}s "
              f"{r['step_wall_mean_s']:.2f}s/step {r['tok_per_s_mean']:.0f} tok/s curve "
              f"{[(c['step'], round(c['greedy'], 3)) for c in r['curve']]} sampling {r['sampling']}")
