"""What every release-chain backend is: the typed interface, its errors, and the rules of a publish.

A scenario's chain is a list of releases r0, r1, ... each the parent of the next, and its head moves
only by compare-and-swap. Two backends implement `Chain`:

    reef.registry.chain     ReleaseChain: append-only jsonl + HEAD + flock under data_dir (the
                            embedded default: one machine, one gateway)
    reef.registry.chain_pg  PgChain: rows in PostgreSQL, the CAS one transaction (several gateways)

A backend supplies only storage: `releases()` (read) and `_commit()` (under its lock or
transaction: read the chain, call `_next_release`, store the result). What a release may be
(r0 only by `create`, a rollback's content, the artifact checks) is decided here, once, so both
backends refuse the same things with the same errors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from reef.core.clock import utcnow
from reef.registry.artifacts import ArtifactStore
from reef.registry.schema import ArtifactKind, Lineage, Operation, Release, Routing, release_name

# How a publish describes its release from the chain as it is under the lock: Release's fields
# other than the ones the chain decides (id, seq, parent, time).
Build = Callable[[list[Release]], dict[str, Any]]


class ReleaseError(RuntimeError):
    pass


class HeadMovedError(ReleaseError):
    """The head is not the release the publisher based its change on (a concurrent or stale
    publisher): nothing was written. The API answers 409."""

    def __init__(self, scenario: str, expected: str | None, actual: str | None) -> None:
        self.scenario = scenario
        self.expected = expected
        self.actual = actual
        super().__init__(f"{scenario}: head is {actual}, not the expected {expected}")


class ReleaseNotFoundError(ReleaseError, LookupError):
    pass


class ChainCorruptError(ReleaseError):
    pass


class NotSelectedError(ReleaseError):
    """The candidate has no `select` decision from the gate (or was rejected, or is released)."""


class StaleGateError(NotSelectedError):
    """The gate compared the candidate with content that no longer serves: gate it again."""


class Chain(ABC):
    """One scenario's release chain, whatever stores it."""

    scenario: str
    # When given, a publish must name content that is in the store, with the kind it has there.
    artifacts: ArtifactStore | None

    # --- storage: what a backend implements ----------------------------------------------------

    @abstractmethod
    def releases(self) -> list[Release]:
        """Every committed release, r0 first."""

    @abstractmethod
    def _commit(self, expected_parent: str | None, build: Build) -> Release:
        """Atomically with respect to every other publisher of this scenario, on any machine: read
        the chain, `self._next_release(releases, expected_parent, build)`, store it; returns once
        it is durable."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the chain lives, for messages."""

    # --- reading -------------------------------------------------------------------------------

    def head(self) -> Release | None:
        releases = self.releases()
        return releases[-1] if releases else None

    def get(self, release_id: str) -> Release:
        for release in self.releases():
            if release.release_id == release_id:
                return release
        raise ReleaseNotFoundError(f"no release {release_id} in {self.location}")

    def lineage(self, release_id: str) -> list[Release]:
        """`release_id` and its ancestors, newest first, ending at r0."""
        by_id = {r.release_id: r for r in self.releases()}
        if release_id not in by_id:
            raise ReleaseNotFoundError(f"no release {release_id} in {self.location}")
        out = [by_id[release_id]]
        while out[-1].parent_release_id is not None:
            out.append(by_id[out[-1].parent_release_id])  # backends check every parent exists
        return out

    # --- publishing ----------------------------------------------------------------------------

    def publish(
        self,
        expected_parent: str | None,
        content_id: str,
        kind: ArtifactKind,
        operation: Operation,
        evaluation: dict[str, Any] | None = None,
        approved_by: str | None = None,
        lineage: Lineage | None = None,
        harness_id: str | None = None,
        harness_lineage: Lineage | None = None,
        routing: Routing | None = None,
    ) -> Release:
        """Append a release serving `content_id` (with harness `harness_id`, traffic split by
        `routing`) if the head is still `expected_parent` (None: the chain is empty);
        HeadMovedError otherwise. Returns once the release is durable."""
        if operation == "rollback":
            raise ValueError("publish a rollback with rollback(), which takes the content from the chain")
        fields = dict(content_id=content_id, kind=kind, operation=operation, evaluation=evaluation,
                      approved_by=approved_by, lineage=lineage, harness_id=harness_id,
                      harness_lineage=harness_lineage, routing=routing)
        return self._commit(expected_parent, lambda _: fields)

    def rollback(
        self, release_id: str, expected_parent: str, approved_by: str, evaluation: dict[str, Any] | None = None
    ) -> Release:
        """Serve `release_id`'s content (weights, harness and traffic split) again, as a new release on
        top of the head."""

        def build(releases: list[Release]) -> dict[str, Any]:
            target = next((r for r in releases if r.release_id == release_id), None)
            if target is None:
                raise ReleaseNotFoundError(f"no release {release_id} in {self.location}")
            if target.traffic() == releases[-1].traffic():
                raise ReleaseError(f"{releases[-1].release_id} already serves {release_id}'s content")
            return dict(content_id=target.content_id, kind=target.kind, operation="rollback",
                        evaluation=evaluation, approved_by=approved_by, lineage=target.lineage,
                        restores=target.release_id, harness_id=target.harness_id,
                        harness_lineage=target.harness_lineage, routing=target.routing)

        return self._commit(expected_parent, build)

    def ensure_base(
        self, content_id: str, lineage: Lineage | None = None, kind: ArtifactKind = "full"
    ) -> Release:
        """Release 0 (the base model), created if the chain is empty; the existing r0 if it serves
        the same content. A different base is refused: the chain already says what r0 was."""
        try:
            self.publish(None, content_id, kind, "create", lineage=lineage)
        except HeadMovedError:
            pass  # r0 exists (maybe a concurrent ensure_base made it): check it is this base
        r0 = self.releases()[0]
        if r0.content_id != content_id:
            raise ReleaseError(f"{r0.release_id} serves content {r0.content_id}, not {content_id}")
        return r0

    def _next_release(self, releases: list[Release], expected_parent: str | None, build: Build) -> Release:
        """The release a commit appends to `releases` (the chain under the backend's lock), or the
        error that refuses it; nothing is stored here."""
        actual = releases[-1].release_id if releases else None
        if actual != expected_parent:
            raise HeadMovedError(self.scenario, expected_parent, actual)
        fields = build(releases)
        seq = len(releases)
        if (fields["operation"] == "create") != (seq == 0):
            raise ValueError(f"operation 'create' makes r0 and only r0 (next is r{seq}, "
                             f"operation {fields['operation']!r})")
        if self.artifacts is not None:
            manifest = self.artifacts.get(fields["content_id"])  # ArtifactNotFoundError if absent
            if manifest.kind != fields["kind"]:
                raise ValueError(f"content {fields['content_id']} is a {manifest.kind} artifact, "
                                 f"not {fields['kind']}")
            if fields.get("harness_id") and self.artifacts.get(fields["harness_id"]).kind != "harness":
                raise ValueError(f"content {fields['harness_id']} is not a harness artifact")
            split = fields["routing"].arm("candidate") if fields.get("routing") else None
            if split is not None and self.artifacts.get(split.content_id).kind != split.kind:
                raise ValueError(f"canary content {split.content_id} is not a {split.kind} artifact")
        return Release(release_id=release_name(self.scenario, seq), scenario=self.scenario, seq=seq,
                       parent_release_id=actual, created_at=utcnow(), **fields)

    def _check_link(self, release: Release, before: list[Release]) -> None:
        """`release` is the one that may follow `before`: its scenario, seq, id and parent."""
        seq = len(before)
        parent = before[-1].release_id if before else None
        if (release.scenario, release.seq, release.release_id, release.parent_release_id) != (
            self.scenario, seq, release_name(self.scenario, seq), parent
        ):
            raise ChainCorruptError(f"{self.location}: release {seq + 1} is {release.release_id} with parent "
                                    f"{release.parent_release_id}, expected {release_name(self.scenario, seq)} "
                                    f"with parent {parent}")
