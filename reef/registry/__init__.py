"""Releases: candidates (a recipe's output folder, `Candidate`), content-addressed artifacts (what is
served) and each scenario's append-only release chain (which artifact serves it, since when,
approved by whom, and what came before).

    from reef.registry import ArtifactStore, ReleaseChain
    store = ArtifactStore.for_data_dir("data")
    chain = ReleaseChain.for_data_dir("data", "sentiment", artifacts=store)
    base = store.import_base("data/models/smollm2-135m-instruct")
    r0 = chain.ensure_base(base.content_id, base.lineage)
    cand = store.import_candidate("data/candidates/sentiment/<id>")
    r1 = chain.publish(r0.release_id, cand.content_id, cand.kind, "train", lineage=cand.lineage)
    path = store.verify(chain.head().content_id)   # refuses a file that does not match its manifest

Both chain backends, files (`ReleaseChain`) and PostgreSQL (`reef.registry.chain_pg.PgChain`, serve.yaml
`state.url`), are a `Chain`; `reef.registry.state.open_chain(data_dir, scenario, url)` picks one.
"""

from reef.registry.artifacts import (
    ArtifactError,
    ArtifactNotFoundError,
    ArtifactStore,
    CorruptArtifactError,
    content_id_of,
)
from reef.registry.chain import (
    Chain,
    ChainCorruptError,
    HeadMovedError,
    ReleaseChain,
    ReleaseError,
    ReleaseNotFoundError,
)
from reef.registry.schema import (
    ArtifactFile,
    ArtifactManifest,
    Candidate,
    Lineage,
    Release,
    Routing,
    RoutingArm,
    release_name,
)

__all__ = [
    "ArtifactError", "ArtifactFile", "ArtifactManifest", "ArtifactNotFoundError", "ArtifactStore", "Candidate",
    "Chain", "ChainCorruptError", "CorruptArtifactError", "HeadMovedError", "Lineage", "Release", "ReleaseChain",
    "ReleaseError", "ReleaseNotFoundError", "Routing", "RoutingArm", "content_id_of", "release_name",
]
