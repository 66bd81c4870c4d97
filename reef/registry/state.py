"""Where the shared state of releases lives: files under the data dir (the embedded default) or
PostgreSQL at serve.yaml's `state.url` (several gateways, one truth). The one place that chooses
a chain backend; everything else holds a `Chain`.

    state = ReleaseState(data_dir, url)            url None: $REEF_STATE__URL, else files
    chain = state.chain("sentiment", artifacts=store)
    state.scenarios(), state.heads()              every chain, and each head in one read

`url` None falls back to REEF_STATE__URL, the environment's form of `state.url` (the config's own
env layer), which `reef serve` sets for the processes it starts (rounds, the gate): a reader given
only a data dir (reef.gate, reef.learn) reads the chain the server publishes to.

What else moved to PostgreSQL with `state.url`, each chosen in its own module the same way:
reports' idempotency keys (reef.experience.report_keys, table reef_report_keys), the learner's
consumed ledger (reef.recipe.ledger, table reef_consumed), and the state machines' event logs:
candidates (reef.registry.candidates), canaries (reef.serving.canary) and learner rounds
(reef.learn.round_log), all through reef.core.eventlog (table reef_events).
"""

from __future__ import annotations

from pathlib import Path

from reef.core.paths import DataDir
from reef.core.pg import STATE_URL_ENV, state_url
from reef.registry.artifacts import ArtifactStore
from reef.registry.chain import CHAIN_FILE, HEAD_FILE, ReleaseChain
from reef.registry.chain_api import Chain
from reef.registry.chain_pg import PgChain, has_chain, heads, open_database

__all__ = ["STATE_URL_ENV", "ReleaseState", "open_chain"]


class ReleaseState:
    def __init__(self, data_dir: Path | str, url: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.url = state_url(url)

    @property
    def shared(self) -> bool:
        """True when other gateways may move heads (PostgreSQL): this one must follow them."""
        return self.url is not None

    def chain(self, scenario: str, *, artifacts: ArtifactStore | None = None) -> Chain:
        if self.url is None:
            return ReleaseChain.for_data_dir(self.data_dir, scenario, artifacts=artifacts)
        # HEAD beside the data dir's experience stays readable by reef.experience.load.
        return PgChain(self.url, scenario, artifacts=artifacts,
                       head_file=DataDir(self.data_dir).releases(scenario) / HEAD_FILE)

    def has_chain(self, scenario: str) -> bool:
        """Whether the scenario has a release (r0 at least); never creates anything."""
        if self.url is None:
            return (DataDir(self.data_dir).releases(scenario) / CHAIN_FILE).is_file()
        return has_chain(open_database(self.url), scenario)

    def scenarios(self) -> list[str]:
        """Scenarios with a chain (maybe still empty)."""
        if self.url is None:
            root = DataDir(self.data_dir).releases()
            return sorted(p.parent.name for p in root.glob(f"*/{CHAIN_FILE}")) if root.is_dir() else []
        return sorted(s for s, head in self.heads().items() if head is not None)

    def heads(self) -> dict[str, str | None]:
        """Each scenario's head release id."""
        if self.url is None:
            return {s: (h.release_id if (h := self.chain(s).head()) else None) for s in self.scenarios()}
        return heads(open_database(self.url))

    def write_head_file(self, scenario: str, release_id: str) -> None:
        """With PostgreSQL: the data dir's HEAD cache of `scenario` (readers of experience use it)
        says `release_id`, after this gateway noticed another moved the head. Files: nothing to do,
        the chain's own HEAD is the cache."""
        chain = self.chain(scenario)
        if isinstance(chain, PgChain):
            chain.write_head_file(release_id)


def open_chain(data_dir: Path | str, scenario: str, url: str | None = None, *,
               artifacts: ArtifactStore | None = None) -> Chain:
    """The scenario's chain in whichever backend `url` names (None: REEF_STATE__URL, else the data
    dir's files)."""
    return ReleaseState(data_dir, url).chain(scenario, artifacts=artifacts)
