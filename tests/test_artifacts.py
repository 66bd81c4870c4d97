"""The artifact store on real files: content ids, idempotent imports, and refusing what does not
match its manifest. Small fake model folders; nothing here loads a model."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from reef.registry import (
    ArtifactError,
    ArtifactNotFoundError,
    ArtifactStore,
    CorruptArtifactError,
)
from reef.registry.artifacts import FILES_DIR, MANIFEST_FILE

pytestmark = pytest.mark.model_free


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_tree(root: Path, files: dict[str, bytes | str]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


TOKENIZER = '{"model": {"vocab": {"a": 0}}}'
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


@pytest.fixture
def base_dir(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "models" / "tiny", {
        "config.json": '{"model_type": "llama"}', "model.safetensors": os.urandom(4096),
        "tokenizer.json": TOKENIZER, "tokenizer_config.json": "{}", "chat_template.jinja": TEMPLATE,
        ".cache/huggingface/download.lock": "",  # tooling state: not content
    })


def candidate_json(kind: str, base_dir: Path, created_at: str = "2024-01-01T00:00:00+00:00") -> str:
    lineage = dict(snapshot_id="demo-abc", snapshot_hash="h" * 64, recipe="recipes.sft:SFT", params={"lr": 1e-4},
                   parent_release="demo@r0", code_commit="deadbeef", base_model=str(base_dir),
                   base_model_sha256=sha((base_dir / "model.safetensors").read_bytes()), versions={"torch": "x"})
    return json.dumps(dict(id="demo-1", path="/somewhere", kind=kind, scenario="demo", metrics={"loss": 1.0},
                           lineage=lineage, created_at=created_at))


@pytest.fixture
def full_dir(tmp_path: Path, base_dir: Path) -> Path:
    return write_tree(tmp_path / "cand-full", {
        "config.json": '{"model_type": "llama"}', "model.safetensors": b"trained weights" * 100,
        "tokenizer.json": TOKENIZER, "chat_template.jinja": TEMPLATE,
        "candidate.json": candidate_json("full", base_dir),
    })


@pytest.fixture
def lora_dir(tmp_path: Path, base_dir: Path) -> Path:
    return write_tree(tmp_path / "cand-lora", {
        "adapter_config.json": json.dumps({"base_model_name_or_path": str(base_dir), "r": 8}),
        "adapter_model.safetensors": b"adapter" * 64, "candidate.json": candidate_json("lora", base_dir),
    })


def expected_content_id(folder: Path, skip: tuple[str, ...] = ("candidate.json",)) -> str:
    """The documented recipe, computed independently: sha256 of a sorted sha256sum listing."""
    rels = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    listing = "".join(f"{sha((folder / r).read_bytes())}  {r}\n" for r in rels if r not in skip)
    return sha(listing.encode())


def test_import_full_candidate(tmp_path: Path, full_dir: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    m = store.import_candidate(full_dir)
    assert m.content_id == expected_content_id(full_dir)
    assert m.kind == "full"
    assert [f.path for f in m.files] == ["chat_template.jinja", "config.json", "model.safetensors", "tokenizer.json"]
    assert m.tokenizer_sha256 == sha(TOKENIZER.encode()) and m.chat_template_sha256 == sha(TEMPLATE.encode())
    assert m.lineage is not None and m.lineage.recipe == "recipes.sft:SFT" and m.lineage.params == {"lr": 1e-4}
    assert m.lineage.parent_release == "demo@r0" and m.lineage.code_commit == "deadbeef"
    path = store.verify(m.content_id)
    assert path == tmp_path / "artifacts" / m.content_id / FILES_DIR
    assert (path / "model.safetensors").read_bytes() == (full_dir / "model.safetensors").read_bytes()
    assert not (path / "candidate.json").exists()
    assert store.get(m.content_id) == m and [x.content_id for x in store.list()] == [m.content_id]


def test_import_is_idempotent(tmp_path: Path, full_dir: Path, base_dir: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    first = store.import_candidate(full_dir)
    # The same weights from another run: another candidate.json (path, created_at), same content.
    again = shutil.copytree(full_dir, tmp_path / "rerun")
    (again / "candidate.json").write_text(candidate_json("full", base_dir, created_at="2025-05-05T00:00:00+00:00"))
    assert store.import_candidate(again) == first  # the stored manifest, lineage of the first import
    assert store.import_candidate(full_dir).content_id == first.content_id
    assert [m.content_id for m in store.list()] == [first.content_id]
    assert sorted(p.name for p in (tmp_path / "artifacts").iterdir()) == sorted([".tmp", first.content_id])
    assert not any((tmp_path / "artifacts" / ".tmp").iterdir())


def test_concurrent_imports_store_one_copy(tmp_path: Path, lora_dir: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    ids: list[str] = []
    threads = [threading.Thread(target=lambda: ids.append(store.import_candidate(lora_dir).content_id))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    assert [m.content_id for m in store.list()] == ids[:1]
    store.verify(ids[0])


def test_import_lora_takes_base_digests(tmp_path: Path, lora_dir: Path, base_dir: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    m = store.import_candidate(lora_dir)
    assert m.kind == "lora" and m.content_id == expected_content_id(lora_dir)
    assert [f.path for f in m.files] == ["adapter_config.json", "adapter_model.safetensors"]
    assert m.base_model == str(base_dir)
    assert m.base_model_sha256 == sha((base_dir / "model.safetensors").read_bytes())
    # The adapter has no tokenizer: it serves with its base model's.
    assert m.tokenizer_sha256 == sha(TOKENIZER.encode()) and m.chat_template_sha256 == sha(TEMPLATE.encode())


def test_import_base_and_link(tmp_path: Path, base_dir: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    m = store.import_base(base_dir, link=True)
    assert m.kind == "full" and m.content_id == expected_content_id(base_dir, skip=())
    assert ".cache/huggingface/download.lock" not in [f.path for f in m.files]
    weights = sha((base_dir / "model.safetensors").read_bytes())
    assert m.base_model_sha256 == weights and m.lineage is not None and m.lineage.base_model_sha256 == weights
    stored = store.verify(m.content_id) / "model.safetensors"
    assert stored.stat().st_ino == (base_dir / "model.safetensors").stat().st_ino  # hardlinked, not copied
    # A copy of the same content is the same artifact.
    assert ArtifactStore(tmp_path / "other").import_base(base_dir).content_id == m.content_id


def test_import_harness_text_tree(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    tree = write_tree(tmp_path / "harness", {"system.md": "Be terse.", "tools/add.json": '{"name": "add"}'})
    m = store.import_harness(tree)
    assert m.kind == "harness" and [f.path for f in m.files] == ["system.md", "tools/add.json"]
    assert store.verify(m.content_id).joinpath("tools/add.json").read_text() == '{"name": "add"}'
    (tree / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ArtifactError, match="blob.bin"):
        store.import_harness(tree)


def test_import_refuses_inconsistent_candidates(tmp_path: Path, lora_dir: Path, full_dir: Path,
                                                base_dir: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    (lora_dir / "candidate.json").write_text(candidate_json("full", base_dir))
    with pytest.raises(ArtifactError, match="adapter_config.json"):
        store.import_candidate(lora_dir)
    (full_dir / "model.safetensors").unlink()
    with pytest.raises(ArtifactError, match="weights"):
        store.import_candidate(full_dir)
    assert store.list() == []


def corrupt(path: Path, data: bytes | None = None) -> None:
    path.chmod(0o644)  # the store keeps its copies read-only
    old = path.read_bytes()
    path.write_bytes(data if data is not None else bytes([old[0] ^ 1]) + old[1:])


def test_modified_adapter_is_refused(tmp_path: Path, lora_dir: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    cid = store.import_candidate(lora_dir).content_id
    corrupt(store.path(cid) / "adapter_model.safetensors")  # same size: only the hash can tell
    with pytest.raises(CorruptArtifactError, match="adapter_model.safetensors") as err:
        store.verify(cid)
    assert err.value.path == "adapter_model.safetensors" and "sha256" in err.value.reason
    # Importing the candidate again repairs the stored copy.
    assert store.import_candidate(lora_dir).content_id == cid
    store.verify(cid)
    corrupt(store.path(cid) / "adapter_config.json", b"{}")
    with pytest.raises(CorruptArtifactError, match="adapter_config.json: size"):
        store.verify(cid)


def test_missing_and_extra_files_are_refused(tmp_path: Path, full_dir: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    cid = store.import_candidate(full_dir).content_id
    (store.path(cid) / "tokenizer.json").unlink()
    with pytest.raises(CorruptArtifactError, match="tokenizer.json: missing"):
        store.verify(cid)
    store.import_candidate(full_dir)
    (store.path(cid) / ".sneaky.py").write_text("import os")
    with pytest.raises(CorruptArtifactError, match=r"\.sneaky\.py: not in the manifest"):
        store.verify(cid)


def test_tampered_manifest_is_refused(tmp_path: Path, full_dir: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    m = store.import_candidate(full_dir)
    weights = store.path(m.content_id) / "model.safetensors"
    corrupt(weights, b"other weights")
    # Rewriting the manifest to match the new file changes what the content id is the hash of.
    files = [f.model_copy(update={"sha256": sha(b"other weights"), "size": 13}) if f.path == "model.safetensors"
             else f for f in m.files]
    manifest_path = tmp_path / "artifacts" / m.content_id / MANIFEST_FILE
    manifest_path.write_text(m.model_copy(update={"files": files}).model_dump_json())
    with pytest.raises(CorruptArtifactError, match="does not hash to the content id"):
        store.verify(m.content_id)
    manifest_path.write_text("{not json")
    with pytest.raises(CorruptArtifactError, match="manifest.json: unreadable"):
        store.verify(m.content_id)


def test_unknown_ids(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    with pytest.raises(ArtifactNotFoundError):
        store.get("0" * 64)
    with pytest.raises(ArtifactNotFoundError, match="not a content id"):
        store.verify("../../etc")
    assert store.list() == [] and not store.exists("0" * 64)


def test_training_events_are_not_part_of_the_artifact(tmp_path: Path, lora_dir: Path) -> None:
    """A recipe's TensorBoard events (different at every run) leave the content id and files alone."""
    store = ArtifactStore(tmp_path / "store")
    before = store.import_candidate(lora_dir)
    write_tree(lora_dir, {"tensorboard/loop/events.out.tfevents.1.host": os.urandom(64)})
    after = store.import_candidate(lora_dir)
    assert after.content_id == before.content_id == expected_content_id(lora_dir.parent / "cand-lora", skip=(
        "candidate.json", "tensorboard/loop/events.out.tfevents.1.host"))
    assert all(not f.path.startswith("tensorboard/") for f in after.files)
