"""The 1M-parameter test model, built by and for the tests: a tiny Qwen2 trained from scratch on CPU
in a few minutes (`model.py`) on a generated corpus (`corpus.py`, `chat_format.py`), with the
scenarios that corpus taught it (`demo-add`: `task.py`, `scenario.py`, `add_corpus.py`; `demo-rules`:
`rules.py`) and the text it learnt for tools, reviews and the shop (`agent_corpus.py`, `reviews.py`,
`shop.py`). Engine-mechanics tests and some benches serve it because it is fast; no scenario Reef
ships depends on it, and nothing under reef/, recipes/, dashboard/, examples/ or notebooks/ imports it.

`demo-add` and `demo-rules` reach the framework as any installed package's scenarios do, through the
`reef.scenarios` entry-point group: `site/` holds a distribution's metadata that declares them, and
`declare_scenarios()` (tests/conftest.py calls it) puts that folder and the checkout on the path of
the test process and of every process it starts (`reef serve`, the learner's rounds, DVC stages).

    python -m tests.helpers.tiny.model --out data/models/tiny --seed 0   # what `make test` builds
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITE = HERE / "site"
REPO = HERE.parents[2]


def declare_scenarios() -> None:
    """demo-add and demo-rules, declared here and in every child process (PYTHONPATH): the entry
    points in `site/` name modules of this package, so the checkout goes on the path too (last, so a
    child's own working directory still comes first)."""
    if str(SITE) not in sys.path:
        sys.path.insert(0, str(SITE))
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    wanted = [str(SITE), *[p for p in current if p not in (str(SITE), str(REPO))], str(REPO)]
    os.environ["PYTHONPATH"] = os.pathsep.join(wanted)
