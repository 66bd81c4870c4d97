"""Releases through one gateway in front of two real vLLM replicas (issue 26 part 2).

Replica `a` is the session's vLLM; replica `b` is an engine of this module's own, started with a
lower `--max-lora-rank`, so it refuses an adapter `a` would take (a real refusal, not a mock), and
it can be killed and restarted. Checked, in file order: `b`, still starting when the gateway does,
gets the release made meanwhile before it takes calls; a LoRA release under load loads on both
before the head moves, and every record's release label answers as that release does; the adapter
`b` refuses fails the release naming `b`, and both keep serving the head; a full-weight release
and a rollback under load, on both; a canary arm on both (one `b` refuses fails its start, naming
`b`); `b` killed under load fails no call, and restarted it is given the head's and the canary's
adapters before it takes calls again.

`b` boots while the gateway starts and the first release is made (a vLLM start is most of this
file's time: ~40 s on 2 busy cores, twice).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from dashboard.synthetic import make_lora_candidate
from reef.client import ReefAPIError, ReefClient
from reef.config import ServeConfig
from reef.core.hashing import sha256_file
from reef.engine.replica_weights import label
from reef.engine.supervisor import EngineSupervisor, free_port
from reef.gateway.transport.replicas import Replicas
from reef.registry.candidates import CandidateRegistry, GateResult, register_candidate
from reef.registry.schema import adapter_name
from reef.serve_process import ServeProcess
from tests.helpers import MODEL_NAME, wait_for
from tests.helpers.releases import Load
from tests.helpers.tiny import task as demo

os.environ.setdefault("OMP_NUM_THREADS", "1")
pytestmark = [pytest.mark.vllm, pytest.mark.start_early(4)]

TOKEN = "test-admin-token"
S = demo.SCENARIO
B_MAX_RANK = 8  # `a` (the session's engine) takes rank 16; `b` refuses it
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
HTTP = httpx.Client(timeout=30)


@dataclass
class Stand:
    gw: ServeProcess
    api: ReefClient
    a: str
    b: EngineSupervisor
    work: Path
    tiny: Path

    def candidate(self, name: str, rank: int = 4, seed: int = 1) -> str:
        """A random LoRA of `rank`, registered and selected against the head: its candidate id."""
        folder = make_lora_candidate(self.tiny, self.work / name, S, seed, rank)
        view = register_candidate(self.work / "data", folder)
        CandidateRegistry(self.work / "data", S).record_gate(view.candidate_id, GateResult(
            decision="select", reason="recorded by the test", head_release_id=self.api.head(S)))
        return view.candidate_id

    def full_candidate(self, name: str, seed: int = 0) -> str:
        """The tiny model with noise on every weight (enough to change its answer), as a full candidate,
        selected against the head."""
        folder = self.work / name
        shutil.copytree(self.tiny, folder)
        weights = folder / "model.safetensors"
        generator = torch.Generator().manual_seed(seed)
        tensors = {k: v + v.std() * torch.randn(v.shape, generator=generator)
                   for k, v in load_file(weights).items()}
        save_file(tensors, weights, metadata={"format": "pt"})
        (folder / "candidate.json").write_text(json.dumps({
            "id": f"{S}-full-{seed}", "kind": "full", "scenario": S, "metrics": {}, "lineage": {
                "snapshot_id": f"{S}-nudged-{seed}", "snapshot_hash": "0" * 64, "recipe": "tests:nudged",
                "params": {"seed": seed}, "parent_release": self.api.head(S), "code_commit": "unknown",
                "base_model": str(self.tiny), "base_model_sha256": sha256_file(self.tiny / "model.safetensors"),
                "versions": {}}}))
        view = register_candidate(self.work / "data", folder)
        CandidateRegistry(self.work / "data", S).record_gate(view.candidate_id, GateResult(
            decision="select", reason="recorded by the test", head_release_id=self.api.head(S)))
        return view.candidate_id

    def sessions(self) -> tuple[str, ...]:
        """Four sessions, two on each replica (rendezvous order, as the gateway picks)."""
        order = Replicas([self.a, self.b.url])
        first = {s: order._order(f"s:{s}")[0].url for s in (f"load-{i}" for i in range(64))}
        on_a = [s for s, url in first.items() if url == self.a][:2]
        on_b = [s for s, url in first.items() if url == self.b.url][:2]
        return (on_a[0], on_b[0], on_a[1], on_b[1])

    def load(self, streams: bool = True) -> Load:
        return Load(self.gw.url, MODEL_NAME, S, MESSAGES, clients=4, sessions=self.sessions(), streams=streams)

    def replicas(self) -> dict[str, dict]:
        rows = HTTP.get(f"{self.gw.url}/reef/status").json()["engine"]["replicas"]
        return {row["url"]: row for row in rows}


@pytest.fixture(scope="module")
def stand(vllm_url: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stand]:
    work = tmp_path_factory.mktemp("replica-releases")
    b = EngineSupervisor(ServeConfig(model=str(tiny_model), served_model_name=MODEL_NAME, data_dir=work / "b",
                                     engine={"port": free_port(), "max_lora_rank": B_MAX_RANK}),
                         work / "b" / "vllm.log")
    b._spawn()  # booting meanwhile: the gateway starts without it, and brings it in step once it answers
    (work / "serve.yaml").write_text(yaml.safe_dump({
        "served_model_name": MODEL_NAME, "admin_token": TOKEN, "store": {"flush_interval_s": 0.2},
        "upstream": {"urls": [vllm_url, b.url], "health_interval_s": 0.2},
        "scenarios": {S: {"policy": "approval"}}}))
    gw: ServeProcess | None = None
    try:
        gw = ServeProcess(work, ["--model", str(tiny_model)]).start(180)
        yield Stand(gw, ReefClient(gw.url, admin_token=TOKEN), vllm_url, b, work, tiny_model)
    finally:
        if gw is not None:
            gw.stop()
        b.stop()


def _adapters(url: str) -> set[str]:
    return {m["id"] for m in HTTP.get(f"{url}/v1/models").json()["data"]}


def _served(stand: Stand, load: Load) -> list[dict]:
    """Every record the load made: release label, replica, and the text the client got."""
    assert not load.errors(), load.errors()[:3]
    out = []
    for outcome in load.outcomes:
        record = HTTP.get(f"{stand.gw.url}/reef/records/{outcome.record_id}").json()
        out.append({"release": record["release_id"], "replica": record["replica"], "text": outcome.text})
    return out


def _one_text_per_release(served: list[dict]) -> dict[str, str]:
    """A label the chain names answers as that release does: one greedy text per label."""
    texts: dict[str, set[str]] = defaultdict(set)
    for row in served:
        texts[row["release"]].add(row["text"])
    assert all(len(t) == 1 for t in texts.values()), dict(texts)
    return {release: next(iter(t)) for release, t in texts.items()}


class Admissions:
    """Watches one replica: each time the gateway shows it in service, it must already hold every
    one of `adapters` (read in that order, so an adapter loaded after the replica was let in is caught)."""

    def __init__(self, stand: Stand, url: str, *adapters: str) -> None:
        self.stand, self.url, self.adapters = stand, url, set(adapters)
        self.without: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Admissions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _watch(self) -> None:
        while not self._stop.is_set():
            healthy = self.stand.replicas()[label(self.url)]["healthy"]
            try:
                if healthy and not self.adapters <= _adapters(self.url):
                    self.without.append(time.strftime("%X"))
            except httpx.HTTPError:
                pass
            time.sleep(0.1)


def test_a_replica_that_starts_late_gets_the_head_first(stand: Stand) -> None:
    first = stand.candidate("first", seed=2)
    made = stand.api.release(S, first, f"{S}@r0", approved_by="pytest")  # to the replicas in service
    with Admissions(stand, stand.b.url, adapter_name(first)) as watch:
        stand.b._wait_healthy()
        wait_for(lambda: stand.replicas()[label(stand.b.url)]["healthy"], timeout=60)
    assert not watch.without, f"b took calls before it had the head's adapter: {watch.without}"
    assert made["release"]["release_id"] == f"{S}@r1"


def test_lora_release_under_load_reaches_both_replicas(stand: Stand) -> None:
    good = stand.candidate("good")
    with stand.load() as load:
        load.wait_for_more(8)
        made = stand.api.release(S, good, f"{S}@r1", approved_by="pytest")
        load.wait_for_more(8)
    assert made["release"]["release_id"] == f"{S}@r2" and made["serving"]["kind"] == "lora"
    name = adapter_name(good)
    assert name in _adapters(stand.a) and name in _adapters(stand.b.url), "the head moved before both had it"
    served = _served(stand, load)
    texts = _one_text_per_release(served)
    assert set(texts) == {f"{S}@r1", f"{S}@r2"} and texts[f"{S}@r1"] != texts[f"{S}@r2"], texts
    after = Counter(row["replica"] for row in served if row["release"] == f"{S}@r2")
    assert set(after) == {label(stand.a), label(stand.b.url)}, after


def test_a_replica_refusing_the_adapter_fails_the_release(stand: Stand) -> None:
    big = stand.candidate("big", rank=16)
    with pytest.raises(ReefAPIError) as refused:
        stand.api.release(S, big, f"{S}@r2", approved_by="pytest")
    assert refused.value.status == 502 and refused.value.code == "swap_failed"
    assert f"replica {label(stand.b.url)}" in refused.value.message, refused.value.message
    assert stand.api.head(S) == f"{S}@r2"
    assert adapter_name(big) not in _adapters(stand.a), "the replica that took it unloaded it again"
    with stand.load() as load:
        load.wait_for_more(12)
    served = _served(stand, load)
    assert {row["release"] for row in served} == {f"{S}@r2"}
    assert {row["replica"] for row in served} == {label(stand.a), label(stand.b.url)}


def test_full_weights_and_rollback_under_load(stand: Stand) -> None:
    """pause -> reload -> verify -> resume on both replicas before the head moves, and back."""
    full = stand.full_candidate("full")
    with stand.load() as load:
        load.wait_for_more(8)
        made = stand.api.release(S, full, f"{S}@r2", approved_by="pytest")["release"]
        load.wait_for_more(8)
        back = stand.api.rollback(S, f"{S}@r0", made["release_id"], approved_by="pytest")["release"]
        load.wait_for_more(8)
    served = _served(stand, load)
    texts = _one_text_per_release(served)
    assert set(texts) == {f"{S}@r2", made["release_id"], back["release_id"]}, texts
    assert texts[made["release_id"]] not in (texts[f"{S}@r2"], texts[back["release_id"]]), texts
    assert {row["replica"] for row in served if row["release"] == made["release_id"]} == {
        label(stand.a), label(stand.b.url)}
    stand.api.rollback(S, f"{S}@r2", back["release_id"], approved_by="pytest")  # the LoRA head, for what follows


def test_a_canary_arm_loads_on_both_replicas(stand: Stand) -> None:
    big = stand.candidate("big-arm", rank=16, seed=4)
    with pytest.raises(ReefAPIError) as refused:
        stand.api.start_canary(S, big, fraction=0.5)
    assert refused.value.status == 502 and f"replica {label(stand.b.url)}" in refused.value.message
    arm = stand.candidate("arm", seed=3)
    started = stand.api.start_canary(S, arm, fraction=0.5, approved_by="pytest")
    assert all(adapter_name(arm) in _adapters(url) for url in (stand.a, stand.b.url))
    with stand.load() as load:
        load.wait_for_more(16)
    texts = _one_text_per_release(_served(stand, load))
    assert set(texts) == {started["head_release_id"], f"{S}@canary-{arm[:12]}"}, texts


def test_restarted_replica_gets_the_head_before_it_serves(stand: Stand) -> None:
    """(with the canary of the test before still running: its arm is brought back too)"""
    b, name = stand.b, adapter_name(stand.api.releases(S)["head"]["content_id"])
    arm_id = stand.api.canary(S)["candidate_id"]
    arm = adapter_name(arm_id)
    with stand.load(streams=False) as load:
        load.wait_for_more(8)
        assert b.pgid is not None
        os.killpg(b.pgid, signal.SIGKILL)  # the whole engine, as a crash takes it
        wait_for(lambda: not stand.replicas()[label(b.url)]["healthy"], timeout=10)
        load.wait_for_more(8)
    served = _served(stand, load)  # no JSON call failed while b died
    b.stop()
    with Admissions(stand, b.url, name, arm) as watch:
        b.start()  # the same port, the base weights, no adapter (no load meanwhile: a start is CPU-bound)
        wait_for(lambda: stand.replicas()[label(b.url)]["healthy"], timeout=60)
        with stand.load(streams=False) as load:
            load.wait_for_more(8)
    assert not watch.without, f"b took calls before it had the head's adapter: {watch.without}"
    served += _served(stand, load)
    assert {row["release"] for row in served} <= {stand.api.head(S), f"{S}@canary-{arm_id[:12]}"}
    _one_text_per_release(served)
    assert label(b.url) in {row["replica"] for row in served[-8:]}, "b serves again once in step"
