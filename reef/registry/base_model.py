"""The base model as release 0 of every scenario, and how an artifact becomes a loadable model folder.

A scenario's chain starts with the base model the server was started with (`create`, r0). A LoRA
artifact runs on a base: the base is found in the artifact store by the weights digest its
manifest records, so a LoRA trained on other weights is refused instead of silently misapplied.
"""

from __future__ import annotations

from pathlib import Path

from reef.registry.artifacts import ArtifactError, ArtifactStore
from reef.registry.chain_api import Chain
from reef.registry.schema import ArtifactManifest, Release
from reef.registry.state import open_chain


def local_model_dir(model: str) -> Path:
    """A local folder for a model path or a Hugging Face id already in the local cache."""
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception as exc:  # noqa: BLE001 - any failure means "not available locally"
        raise ArtifactError(f"base model {model!r} is neither a folder nor in the local Hugging Face cache") from exc


def import_base_model(store: ArtifactStore, model: str) -> ArtifactManifest:
    # Hardlinked where possible: a multi-GB base is not copied on every start.
    return store.import_base(local_model_dir(model), link=True)


def ensure_scenario(data_dir: Path | str, scenario: str, model: str, store: ArtifactStore | None = None,
                    state_url: str | None = None) -> tuple[Chain, Release]:
    """The scenario's chain (in files, or in PostgreSQL at `state_url`) and its r0, created from
    `model` on first use."""
    store = store or ArtifactStore.for_data_dir(data_dir)
    chain = open_chain(data_dir, scenario, state_url, artifacts=store)
    releases = chain.releases()
    r0 = releases[0] if releases else None
    if r0 is None:
        base = import_base_model(store, model)
        r0 = chain.ensure_base(base.content_id, base.lineage)
    return chain, r0


def base_of(store: ArtifactStore, manifest: ArtifactManifest) -> ArtifactManifest:
    """The full artifact a LoRA runs on: the stored base whose weights digest the LoRA names."""
    if manifest.kind != "lora":
        raise ValueError(f"{manifest.content_id} is a {manifest.kind} artifact, not a LoRA")
    want = manifest.base_model_sha256
    for other in store.list():
        # Its own weights file, not its `base_model_sha256`: a full candidate names its base there.
        if want and other.kind == "full" and any(f.sha256 == want and f.path.endswith(".safetensors")
                                                 for f in other.files):
            return other
    raise ArtifactError(f"LoRA {manifest.content_id[:12]} runs on weights {manifest.base_model_sha256}, "
                        "which no stored base model has")


def model_folders(store: ArtifactStore, content_id: str) -> tuple[Path, Path | None]:
    """(full model folder, adapter folder or None) for an artifact, each verified byte for byte."""
    manifest = store.get(content_id)
    if manifest.kind == "full":
        return store.verify(content_id), None
    if manifest.kind == "lora":
        return store.verify(base_of(store, manifest).content_id), store.verify(content_id)
    raise ArtifactError(f"{content_id[:12]} is a {manifest.kind} artifact: it has no weights")
