"""Where things live on disk: the data dir's layout, and the names of the files other layers agree on.

A data dir (`reef serve --data-dir`, `data/` by default) holds the experience the gateway records,
the release chains, the artifact store, the learner's rounds and what a round makes (snapshots,
candidates, the consumed ledger). `DataDir` is the one place that knows the folder names; a layer
keeps the names of the files inside its own folders. A candidate folder holds `candidate.json`
(its kind, lineage and metrics) beside the weights, read and written by
`reef.registry.schema.Candidate`; its name is here because the folder is not the registry's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CANDIDATE_FILE = "candidate.json"
DEFAULT_DATA_DIR = Path("data")


@dataclass(frozen=True, init=False)
class DataDir:
    """A data dir's folders; a scenario's, when the layout keeps one per scenario."""

    root: Path

    def __init__(self, root: Path | str = DEFAULT_DATA_DIR) -> None:
        object.__setattr__(self, "root", Path(root))

    def _per_scenario(self, folder: str, scenario: str | None) -> Path:
        return self.root / folder if scenario is None else self.root / folder / scenario

    def experience(self, scenario: str | None = None) -> Path:
        """What the gateway recorded: `experience/<scenario>/{records,reports}/` parquet shards."""
        return self._per_scenario("experience", scenario)

    def releases(self, scenario: str | None = None) -> Path:
        """Release chains (`releases/<scenario>/chain.jsonl`, HEAD, canaries), and the engine's swap state."""
        return self._per_scenario("releases", scenario)

    def learner(self, scenario: str | None = None) -> Path:
        """The learner's rounds: `learner/rounds.jsonl`, `learner/<scenario>/` (round events, request, result, log)."""
        return self._per_scenario("learner", scenario)

    def gate(self, scenario: str | None = None) -> Path:
        """What the gate keeps between gates: `gate/<scenario>/head-replies.jsonl` (reef.gate.head_replies)."""
        return self._per_scenario("gate", scenario)

    def snapshots(self, scenario: str | None = None) -> Path:
        """Frozen experience a round trains on: `snapshots/<scenario>/` (fixed) or `snapshots/<id>/`."""
        return self._per_scenario("snapshots", scenario)

    def candidates(self, scenario: str | None = None) -> Path:
        """What a round trained: `candidates/<scenario>/` (fixed) or `candidates/<id>/`."""
        return self._per_scenario("candidates", scenario)

    @property
    def artifacts(self) -> Path:
        """The content-addressed artifact store (weights, adapters, harnesses)."""
        return self.root / "artifacts"

    @property
    def ledger(self) -> Path:
        """The record ids each scenario's rounds consumed."""
        return self.root / "ledger"

    @property
    def wal(self) -> Path:
        """The experience store's write-ahead log (one gateway's: `store.partition` unset)."""
        return self.root / "wal"

    def store_wal(self, partition: str | None) -> Path:
        """The write-ahead log of the gateway writing `partition` (`store.partition`): `wal/` for
        none, else `wal/partitions/<partition>/` (a folder of its own: its segments and its lock)."""
        return self.wal if partition is None else self.wal / "partitions" / partition

    @property
    def metrics(self) -> Path:
        """The DVC pipeline's evaluate stage's metrics, one JSON file per scenario."""
        return self.root / "metrics"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def cache(self) -> Path:
        """The engine's compile caches."""
        return self.root / "cache"
