"""Content-addressed artifacts: the exact files a release serves, verified before they are served.

    <root>/<content_id>/manifest.json   ArtifactManifest: kind, base model, digests, files, lineage
    <root>/<content_id>/files/...       the model folder, LoRA adapter folder or harness text tree
    <root>/.tmp/                        imports in progress

`content_id` is the sha256 of a `sha256sum`-style listing of the files ("<sha256>  <path>\\n" per
file, sorted by path), so in `files/` this reproduces it by hand:
`sha256sum $(find . -type f | sed 's|^./||' | LC_ALL=C sort) | sha256sum`.
An import is staged under `.tmp/` and renamed into place, so `<content_id>/` is either complete or
absent; importing the same content again yields the same id and no second copy. The store writes
plain files: DVC-tracking `<root>` (the heavy part) is up to whoever publishes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reef.core.clock import utcnow
from reef.core.durable import fsync_path
from reef.core.hashing import sha256_file, sha256_tree
from reef.core.paths import CANDIDATE_FILE, DataDir
from reef.registry.schema import (
    CONTENT_ID_RE,
    ArtifactFile,
    ArtifactKind,
    ArtifactManifest,
    Candidate,
    Lineage,
)

log = logging.getLogger(__name__)

DEFAULT_ROOT = DataDir().artifacts
MANIFEST_FILE = "manifest.json"
FILES_DIR = "files"
# A candidate folder's CANDIDATE_FILE is metadata (its path and created_at differ between two runs
# of the same weights), so it is not content: its lineage goes into the manifest instead.
# A recipe's per-step TensorBoard events (reef.recipe.training_log): about the run, not the artifact,
# and different at every run (wall times), so never part of the content id.
TRAINING_EVENTS_DIR = "tensorboard"
ADAPTER_CONFIG = "adapter_config.json"
HARNESS_METRICS_FILE = "eval.json"  # `reef recipe run` writes its gate metrics into the candidate folder
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_BLOCK = 1 << 20


class ArtifactError(RuntimeError):
    pass


class ArtifactNotFoundError(ArtifactError, LookupError):
    pass


class CorruptArtifactError(ArtifactError):
    """The stored files do not match the manifest: the artifact must not be served."""

    def __init__(self, content_id: str, path: str, reason: str) -> None:
        self.content_id = content_id
        self.path = path
        self.reason = reason
        super().__init__(f"artifact {content_id}: {path}: {reason}")


def content_id_of(files: Iterable[ArtifactFile]) -> str:
    return sha256_tree((f.path, f.sha256) for f in files)


def tree_files(root: Path, *, skip_hidden: bool = True) -> list[str]:
    """Relative paths of the regular files under `root`, sorted. Dot-entries are tooling state
    (.cache/huggingface, .git), not content; symlinks are followed (DVC checkouts use them)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        if skip_hidden:
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel_dir = Path(dirpath).relative_to(root)
        for name in filenames:
            if skip_hidden and name.startswith("."):
                continue
            rel = (rel_dir / name).as_posix()
            if "\n" in rel:  # would break the listing content_id is the hash of
                raise ArtifactError(f"{root}: file name with a newline: {rel!r}")
            out.append(rel)
    return sorted(out)


def _template_digest(folder: Path, hashes: dict[str, str] | None = None) -> str | None:
    """The chat template a tokenizer folder applies: chat_template.jinja, else the one inline in
    tokenizer_config.json (older transformers)."""
    jinja = folder / "chat_template.jinja"
    if hashes is not None and "chat_template.jinja" in hashes:
        return hashes["chat_template.jinja"]
    if jinja.is_file():
        return sha256_file(jinja)
    config = folder / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text()).get("chat_template")
        if template:
            return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return None


class ArtifactStore:
    def __init__(self, root: Path | str = DEFAULT_ROOT, *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync

    @classmethod
    def for_data_dir(cls, data_dir: Path | str, **kw: Any) -> ArtifactStore:
        return cls(DataDir(data_dir).artifacts, **kw)

    # --- importing ---------------------------------------------------------------------------

    def import_candidate(
        self, candidate_dir: Path | str, *, base_model_dir: Path | str | None = None, link: bool = False
    ) -> ArtifactManifest:
        """A recipe's candidate folder: a PEFT adapter (adapter_config.json present) or full
        weights, with the lineage from its candidate.json (if it has one)."""
        src = Path(candidate_dir)
        candidate = Candidate.read_if_any(src)
        is_adapter = (src / ADAPTER_CONFIG).is_file()
        kind: ArtifactKind = (candidate.kind if candidate else None) or ("lora" if is_adapter else "full")
        if kind not in ("lora", "full") or (kind == "lora") != is_adapter:
            raise ArtifactError(f"{src}: candidate.json says kind {kind!r} but {ADAPTER_CONFIG} is "
                                f"{'present' if is_adapter else 'absent'}")
        lineage = candidate.lineage.given() if candidate else None
        base = lineage.base_model if lineage else None
        if base is None and is_adapter:
            base = json.loads((src / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
        return self.import_tree(
            src, kind, base_model=base, base_model_sha256=lineage.base_model_sha256 if lineage else None,
            base_model_dir=base_model_dir, lineage=lineage, link=link,
        )

    def import_base(
        self, model_dir: Path | str, *, lineage: Lineage | None = None, link: bool = False
    ) -> ArtifactManifest:
        """The base model a scenario's release 0 serves."""
        src = Path(model_dir)
        weights = src / "model.safetensors"
        sha = sha256_file(weights) if weights.is_file() else None
        lineage = lineage or Lineage(base_model=str(src), base_model_sha256=sha)
        return self.import_tree(src, "full", base_model=str(src), base_model_sha256=sha, lineage=lineage, link=link)

    def import_harness(self, tree: Path | str, *, lineage: Lineage | None = None) -> ArtifactManifest:
        """A text tree (prompts, tool definitions, configs) that changes behaviour without weights.
        A candidate folder's `eval.json` (`reef recipe run`'s metrics) is not part of it."""
        return self.import_tree(Path(tree), "harness", lineage=lineage)

    def import_tree(
        self,
        src: Path,
        kind: ArtifactKind,
        *,
        base_model: str | None = None,
        base_model_sha256: str | None = None,
        base_model_dir: Path | str | None = None,
        lineage: Lineage | None = None,
        link: bool = False,
    ) -> ArtifactManifest:
        """Copy (or, with `link`, hardlink where the filesystem allows) `src` into the store."""
        paths = [p for p in tree_files(src) if p != CANDIDATE_FILE and not p.startswith(f"{TRAINING_EVENTS_DIR}/")
                 and not (kind == "harness" and p == HARNESS_METRICS_FILE)]
        if not paths:
            raise ArtifactError(f"{src}: no files to import")
        _check_kind(src, kind, paths)
        (self.root / ".tmp").mkdir(parents=True, exist_ok=True)
        staging = self.root / ".tmp" / uuid.uuid4().hex
        try:
            files = [self._stage_file(src / p, staging / FILES_DIR / p, p, link=link) for p in paths]
            hashes = {f.path: f.sha256 for f in files}
            base_dir = Path(base_model_dir) if base_model_dir else (Path(base_model) if base_model else None)
            if base_dir is not None and not base_dir.is_dir():
                base_dir = None  # a hub name: its digests are not known here
            tokenizer = hashes.get("tokenizer.json")
            if tokenizer is None and base_dir is not None and (base_dir / "tokenizer.json").is_file():
                tokenizer = sha256_file(base_dir / "tokenizer.json")
            template = _template_digest(staging / FILES_DIR, hashes)
            if template is None and base_dir is not None:
                template = _template_digest(base_dir)
            content_id = content_id_of(files)
            manifest = ArtifactManifest(
                content_id=content_id, kind=kind, base_model=base_model, base_model_sha256=base_model_sha256,
                tokenizer_sha256=tokenizer, chat_template_sha256=template, files=files, lineage=lineage,
                source=str(src), created_at=utcnow(),
            )
            (staging / MANIFEST_FILE).write_text(manifest.model_dump_json(indent=2) + "\n")
            if self.fsync:
                fsync_path(staging / MANIFEST_FILE)
                for d in sorted({(staging / FILES_DIR / p).parent for p in paths} | {staging / FILES_DIR, staging}):
                    fsync_path(d)
            return self._install(staging, manifest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _stage_file(self, src: Path, dst: Path, rel: str, *, link: bool) -> ArtifactFile:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if link:
            try:
                os.link(src, dst)
                # Hashed after linking: what is hashed is what is stored, whatever src did meanwhile.
                if self.fsync:
                    fsync_path(dst)
                return ArtifactFile(path=rel, sha256=sha256_file(dst), size=dst.stat().st_size)
            except OSError:  # another filesystem, or links not allowed: copy instead
                dst.unlink(missing_ok=True)
        digest, size = hashlib.sha256(), 0
        # One read both hashes and copies, so the hash is of exactly the bytes written.
        with src.open("rb") as fi, dst.open("xb") as fo:
            for block in iter(lambda: fi.read(_BLOCK), b""):
                digest.update(block)
                fo.write(block)
                size += len(block)
            fo.flush()
            if self.fsync:
                os.fsync(fo.fileno())
        dst.chmod(0o444)  # a copy is the store's own: guard it against edits in place
        return ArtifactFile(path=rel, sha256=digest.hexdigest(), size=size)

    def _install(self, staging: Path, manifest: ArtifactManifest) -> ArtifactManifest:
        final = self.root / manifest.content_id
        try:
            os.rename(staging, final)  # fails if final exists (and is not empty)
        except OSError:
            if not final.is_dir():
                raise
            try:
                self.verify(manifest.content_id)
                return self.get(manifest.content_id)  # same content already stored: keep its manifest
            except CorruptArtifactError as exc:
                log.warning("replacing corrupt stored artifact with a fresh import: %s", exc)
                trash = self.root / ".tmp" / f"corrupt-{uuid.uuid4().hex}"
                os.rename(final, trash)
                os.rename(staging, final)
                shutil.rmtree(trash, ignore_errors=True)
        if self.fsync:
            fsync_path(self.root)
        return manifest

    # --- reading -----------------------------------------------------------------------------

    def _dir(self, content_id: str) -> Path:
        if not CONTENT_ID_RE.match(content_id):  # it becomes a path: no traversal, no partial ids
            raise ArtifactNotFoundError(f"not a content id: {content_id!r}")
        return self.root / content_id

    def exists(self, content_id: str) -> bool:
        return CONTENT_ID_RE.match(content_id) is not None and (self.root / content_id / MANIFEST_FILE).is_file()

    def get(self, content_id: str) -> ArtifactManifest:
        path = self._dir(content_id) / MANIFEST_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ArtifactNotFoundError(f"no artifact {content_id} in {self.root}") from None
        try:
            return ArtifactManifest.model_validate_json(data)
        except ValidationError as exc:
            raise CorruptArtifactError(content_id, MANIFEST_FILE, f"unreadable: {exc}") from None

    def path(self, content_id: str) -> Path:
        """The files folder, unverified: `verify()` it before serving from it."""
        return self._dir(content_id) / FILES_DIR

    def list(self) -> list[ArtifactManifest]:
        out = []
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if CONTENT_ID_RE.match(entry.name) and (entry / MANIFEST_FILE).is_file():
                    try:
                        out.append(self.get(entry.name))
                    except CorruptArtifactError as exc:
                        log.warning("skipping %s", exc)
        return sorted(out, key=lambda m: (m.created_at, m.content_id))

    def verify(self, content_id: str) -> Path:
        """The files folder, once every file is exactly what the manifest lists (and nothing else
        is there); otherwise CorruptArtifactError naming the first bad file. Reads every byte."""
        manifest = self.get(content_id)
        if manifest.content_id != content_id or content_id_of(manifest.files) != content_id:
            raise CorruptArtifactError(content_id, MANIFEST_FILE, "the file list does not hash to the content id")
        folder = self.path(content_id)
        expected = {f.path: f for f in manifest.files}
        present = set(tree_files(folder, skip_hidden=False)) if folder.is_dir() else set()
        for rel in sorted(present - expected.keys()):
            raise CorruptArtifactError(content_id, rel, "not in the manifest")
        # Cheap checks for every file before reading any of them.
        for f in manifest.files:
            if f.path not in present:
                raise CorruptArtifactError(content_id, f.path, "missing")
            size = (folder / f.path).stat().st_size
            if size != f.size:
                raise CorruptArtifactError(content_id, f.path, f"size {size} != manifest {f.size}")
        for f in manifest.files:
            actual = sha256_file(folder / f.path)
            if actual != f.sha256:
                raise CorruptArtifactError(content_id, f.path, f"sha256 {actual} != manifest {f.sha256}")
        return folder


def _check_kind(src: Path, kind: ArtifactKind, paths: list[str]) -> None:
    if kind == "lora" and ADAPTER_CONFIG not in paths:
        raise ArtifactError(f"{src}: a LoRA artifact needs {ADAPTER_CONFIG}")
    if kind == "full" and not any(p.endswith(_WEIGHT_SUFFIXES) for p in paths):
        raise ArtifactError(f"{src}: a full artifact needs weights ({', '.join(_WEIGHT_SUFFIXES)})")
    if kind == "harness":
        for p in paths:
            try:
                (src / p).read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise ArtifactError(f"{src}: a harness is a text tree, but {p} is not UTF-8 text") from None
