"""Releases against a real vLLM: the gate decides, the publisher hot-swaps LoRA and full weights
while clients stream, records carry the release that answered them, rollbacks restore the old
outputs, corrupt or rejected candidates never serve, a canary splits traffic and decides on live
rewards, and a restarted `reef serve` serves each scenario's head.

One gateway (in front of the session's vLLM, which runs with runtime LoRA and dev mode) for the
module; the tests run in file order and each starts from the head the previous one left.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from reef.client import HeadMovedError, ReefAPIError, ReefClient
from reef.config import GateSettings
from reef.gate.evaluate import evaluate_candidate
from reef.recipe import Candidate
from reef.registry.candidates import CandidateRegistry, register_candidate
from tests.helpers import MODEL_NAME, TINY
from tests.helpers.gateway import Gateway
from tests.helpers.releases import Load, greedy, train_candidates
from tests.helpers.tiny import task as demo

os.environ.setdefault("OMP_NUM_THREADS", "1")
pytestmark = [pytest.mark.vllm, pytest.mark.start_early(3)]

TOKEN = "test-admin-token"
S = demo.SCENARIO
FRACTION = 0.3
MIN_REPORTS = 5
Probes = dict[str, tuple[list[dict[str, str]], str, str]]
HTTP = httpx.Client(timeout=30)  # one client for the many record look-ups and reports: a new one costs ~40 ms CPU


@pytest.fixture(scope="module")
def cands(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Candidate]:
    # 10 steps are plenty: each is selected with a CI low of +0.2 or more and answers most eval prompts
    # differently from the base (measured on the embedded model: +0.21..+0.33, 47..65 of 80 prompts).
    lora = {"kind": "lora", "max_steps": 10, "learning_rate": 5e-3}
    return train_candidates(tiny_model, tmp_path_factory.mktemp("cands"), {
        "lora": lora, "canary": {**lora, "seed": 1}, "corrupt": {**lora, "seed": 2}, "race": {**lora, "seed": 3},
        "full": {"kind": "full", "max_steps": 10, "learning_rate": 5e-4},
        # A step too small to change anything: the gate cannot tell it from the head, so it rejects it.
        "same": {"kind": "full", "max_steps": 1, "learning_rate": 1e-12},
    })


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("release")
    (work / "serve.yaml").write_text(yaml.safe_dump({
        "served_model_name": MODEL_NAME, "admin_token": TOKEN,
        "store": {"flush_interval_s": 0.2},
        "scenarios": {S: {"policy": "approval", "canary": {"fraction": FRACTION, "min_reports": MIN_REPORTS}}},
    }))
    return work


@pytest.fixture(scope="module")
def ids(cands: dict[str, Candidate], workdir: Path) -> dict[str, str]:
    """Every candidate registered and gated in the gateway's data dir: name -> candidate id."""
    out = {}
    for name, cand in cands.items():
        view = register_candidate(workdir / "data", cand.path)
        evaluate_candidate(workdir / "data", view.candidate_id, GateSettings(samples=2), progress=False)
        out[name] = view.candidate_id
    return out


@pytest.fixture(scope="module")
def gw(vllm_url: str, workdir: Path, ids: dict[str, str]) -> Iterator[Gateway]:
    gateway = Gateway(workdir, vllm_url, ["--model", str(TINY)]).start()
    yield gateway
    if gateway.process is not None:
        gateway.stop()


@pytest.fixture(scope="module")
def api(gw: Gateway) -> ReefClient:
    return ReefClient(gw.url, admin_token=TOKEN)


@pytest.fixture(scope="module")
def probe(cands: dict[str, Candidate]) -> Probes:
    """Per candidate: the first eval prompt it answers differently from the base, with both answers.
    The first 16 prompts nearly always hold one (a trained candidate differs on most); all 80 otherwise."""
    prompts = [t.messages for t in demo.eval_tasks()]
    out: Probes = {}
    for n in (16, len(prompts)):
        base = greedy(TINY, prompts[:n])
        for name in ("lora", "full", "race"):
            if name not in out:
                mine = greedy(cands[name].path, prompts[:n])
                i = next((i for i in range(n) if mine[i] != base[i]), None)
                if i is not None:
                    out[name] = (prompts[i], base[i], mine[i])
        if len(out) == 3:
            break
    missing = {"lora", "full", "race"} - set(out)
    assert not missing, f"{sorted(missing)} answer every eval prompt as the base does"
    return out


def head(api: ReefClient) -> str:
    found = api.head(S)
    assert found is not None
    return found


def ask(gw: Gateway, messages: list[dict[str, str]]) -> tuple[str, str]:
    raw = gw.client(**{"x-reef-scenario": S}).chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=messages, temperature=0, max_tokens=8)
    return raw.parse().choices[0].message.content or "", raw.headers["x-reef-agent-record-id"]


def release_of(gw: Gateway, record_id: str) -> str:
    return HTTP.get(f"{gw.url}/reef/records/{record_id}").json()["release_id"]


def check_records(gw: Gateway, api: ReefClient, load: Load, texts_by_content: dict[str, str]) -> Counter[str]:
    """No request failed, and each record's reply is the one its release's weights give."""
    assert not load.errors(), load.errors()[:3]
    content_of = {r["release_id"]: r["content_id"] for r in api.releases(S)["releases"]}
    seen: Counter[str] = Counter()
    for outcome in load.outcomes:
        assert outcome.record_id
        release = release_of(gw, outcome.record_id)
        expected = texts_by_content[content_of[release]]
        assert outcome.text == expected, (f"{outcome.record_id} ({'stream' if outcome.stream else 'json'}) "
                                          f"is labelled {release} but answered {outcome.text!r}, not {expected!r}")
        seen[release] += 1
    return seen


def test_admin_operations_need_the_token(gw: Gateway, ids: dict[str, str]) -> None:
    r = httpx.post(f"{gw.url}/reef/scenarios/{S}/releases", json={"candidate": ids["lora"], "expected_parent": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_token"
    r = httpx.post(f"{gw.url}/reef/scenarios/{S}/rollback", headers={"Authorization": "Bearer wrong"},
                   json={"release_id": f"{S}@r0", "expected_parent": f"{S}@r0"})
    assert r.status_code == 401
    r = httpx.post(f"{gw.url}/reef/scenarios/{S}/releases", headers={"Authorization": f"Bearer {TOKEN}"},
                   json={"candidate": ids["lora"]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "expected_parent"


def test_gate_selects_trained_and_rejects_unchanged_candidates(api: ReefClient, ids: dict[str, str]) -> None:
    views = {c["candidate_id"]: c for c in api.candidates(S)}
    for name in ("lora", "full", "canary", "race"):
        gate = views[ids[name]]["gate"]
        assert views[ids[name]]["status"] == "selected", gate
        assert gate["ci_low"] > 0 and gate["head_release_id"] == f"{S}@r0"
    same = views[ids["same"]]
    assert same["status"] == "rejected" and same["gate"]["decision"] == "reject"
    assert same["gate"]["ci_low"] <= 0 <= same["gate"]["ci_high"], same["gate"]
    detail = api.candidate(ids["lora"][:12])
    assert len(detail["gate"]["per_prompt"]) == detail["gate"]["prompts"] > 0


def test_gate_fails_closed(workdir: Path, cands: dict[str, Candidate], tmp_path: Path) -> None:
    """A candidate for a scenario with no eval suite is rejected, with the error as its reason."""
    meta = json.loads((cands["lora"].path / "candidate.json").read_text())
    other = tmp_path / "other"
    shutil.copytree(cands["lora"].path, other)  # with its tensorboard/ folder
    (other / "candidate.json").write_text(json.dumps({**meta, "scenario": "no-suite"}))
    view = register_candidate(tmp_path / "data", other)
    result = evaluate_candidate(tmp_path / "data", view.candidate_id, progress=False)
    assert result.decision == "reject" and "gate error" in result.reason and "no eval suite" in result.reason
    assert CandidateRegistry(tmp_path / "data", "no-suite").get(view.candidate_id).status == "rejected"


def test_a_rejected_candidate_never_serves(gw: Gateway, api: ReefClient, ids: dict[str, str],
                                           probe: Probes) -> None:
    before = head(api)
    with pytest.raises(ReefAPIError) as err:
        api.release(S, ids["same"], before)
    assert err.value.status == 409 and err.value.code == "not_selected"
    assert head(api) == before
    messages, base_text, _ = probe["lora"]
    text, record_id = ask(gw, messages)
    assert text == base_text and release_of(gw, record_id) == before


def test_a_corrupt_adapter_is_refused_and_nothing_changes(gw: Gateway, api: ReefClient, ids: dict[str, str],
                                                          workdir: Path, probe: Probes) -> None:
    before = head(api)
    weights = workdir / "data" / "artifacts" / ids["corrupt"] / "files" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ReefAPIError) as err:
        api.release(S, ids["corrupt"], before)
    assert err.value.status == 502 and err.value.code == "swap_failed"
    assert "sha256" in err.value.message
    assert head(api) == before
    serving = api.status()["scenarios"][S]["serving"]
    assert serving["release_id"] == before and "failed" in serving["error"]
    messages, base_text, _ = probe["lora"]
    text, record_id = ask(gw, messages)
    assert text == base_text and release_of(gw, record_id) == before


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_release_under_load_then_rollback(gw: Gateway, api: ReefClient, ids: dict[str, str], kind: str,
                                          probe: Probes) -> None:
    messages, base_text, cand_text = probe[kind]
    old = head(api)
    clients = 8
    with Load(gw.url, MODEL_NAME, S, messages, clients=clients) as load:
        load.wait_for_more(clients)  # requests under the old head
        made = api.release(S, ids[kind], old, approved_by="pytest")
        new = made["release"]["release_id"]
        assert made["release"]["operation"] == "train" and made["release"]["approved_by"] == "pytest"
        assert made["serving"]["release_id"] == new and made["serving"]["kind"] == kind
        load.wait_for_more(2 * clients)  # some sent after the swap: answered by the new head
        assert ask(gw, messages)[0] == cand_text  # outputs became the candidate's
        back = api.rollback(S, old, new, approved_by="pytest")["release"]
        assert back["operation"] == "rollback" and back["restores"] == old
        load.wait_for_more(2 * clients)
    base_content = api.releases(S)["releases"][0]["content_id"]
    seen = check_records(gw, api, load, {base_content: base_text, ids[kind]: cand_text})
    assert seen[old] > 0 and seen[new] > 0 and seen[back["release_id"]] > 0, seen
    assert ask(gw, messages)[0] == base_text  # the rollback brought the old outputs back
    assert api.candidates(S)[0]["status"] in {"released", "selected", "rejected"}
    assert {c["candidate_id"]: c for c in api.candidates(S)}[ids[kind]]["release_id"] == new


def test_fifty_concurrent_publishers_exactly_one_wins(api: ReefClient, ids: dict[str, str]) -> None:
    parent = head(api)
    results: list[object] = []

    def publish() -> None:
        try:
            results.append(ReefClient(api.url, admin_token=TOKEN).release(S, ids["race"], parent)["release"])
        except HeadMovedError as exc:
            results.append(exc)

    threads = [threading.Thread(target=publish) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wins = [r for r in results if isinstance(r, dict)]
    assert len(results) == 50 and len(wins) == 1, results[:3]
    assert all(isinstance(r, HeadMovedError) and r.status == 409 for r in results if r is not wins[0])
    releases = api.releases(S)["releases"]
    assert releases[-1]["release_id"] == wins[0]["release_id"] and releases[-1]["parent_release_id"] == parent
    assert [r["seq"] for r in releases] == list(range(len(releases)))  # never forked


def test_cli_release_rollback_releases_and_lineage(gw: Gateway, api: ReefClient, ids: dict[str, str],
                                                    workdir: Path) -> None:
    def reef(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "reef.cli", *args, "--data-dir", str(workdir / "data")],
                              capture_output=True, text=True, env={**os.environ, "REEF_ADMIN_TOKEN": TOKEN})

    parent = head(api)
    stale = reef("release", ids["lora"][:12], "--expect", f"{S}@r0", "--url", gw.url)
    assert stale.returncode == 2 and "head_moved" in stale.stderr, stale.stderr
    assert head(api) == parent
    back = reef("rollback", f"{S}@r0", "--expect", parent, "--url", gw.url)
    assert back.returncode == 0 and f"serves {S}@r0's content again" in back.stdout, back.stderr
    rolled = head(api)
    assert rolled != parent
    again = reef("rollback", parent, "--expect", rolled, "--url", gw.url, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["release"]["content_id"] == ids["race"]
    listing = reef("releases", "--scenario", S)
    assert listing.returncode == 0 and head(api) in listing.stdout
    lineage = json.loads(reef("lineage", head(api), "--json").stdout)
    assert lineage[0]["restores"] == parent and lineage[-1]["release_id"] == f"{S}@r0"
    assert reef("lineage", "not-a-release").returncode == 2


def test_a_restarted_server_serves_the_head(gw: Gateway, api: ReefClient, ids: dict[str, str],
                                            probe: Probes) -> None:
    before = head(api)
    assert api.releases(S)["head"]["content_id"] == ids["race"]
    gw.stop()
    gw.start()
    assert head(api) == before
    messages, _, race_text = probe["race"]
    text, record_id = ask(gw, messages)
    assert text == race_text and release_of(gw, record_id) == before
    assert api.status()["scenarios"][S]["serving"]["error"] is None


def test_a_candidate_gated_against_other_content_must_be_gated_again(api: ReefClient, ids: dict[str, str]) -> None:
    """`canary` was gated against r0 (the base); the head now serves `race`: releasing it needs a new gate."""
    parent = head(api)
    with pytest.raises(ReefAPIError) as err:
        api.release(S, ids["canary"], parent)
    assert err.value.status == 409 and err.value.code == "gate_stale", err.value
    assert head(api) == parent and api.candidate(ids["canary"])["status"] == "selected"


def _canary_requests(gw: Gateway, n: int) -> list[tuple[str, str]]:
    """`n` requests while a canary runs: (record id, the release it was recorded under)."""
    client = gw.client(**{"x-reef-scenario": S})
    out = []
    for i in range(n):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": f"What is {i} + 1?"}], max_tokens=4)
        record_id = raw.headers["x-reef-agent-record-id"]
        out.append((record_id, release_of(gw, record_id)))
    return out


def _report(gw: Gateway, records: list[tuple[str, str]], score: dict[str, float]) -> None:
    """Each record reported with the score of the arm it went to."""
    for record_id, release in records:
        arm = "candidate" if "@canary-" in release else "head"
        r = HTTP.post(f"{gw.url}/reef/report", headers={"x-reef-scenario": S},
                      json={"agent_record_id": record_id, "score": score[arm]})
        assert r.status_code == 200, r.text


def _decided(api: ReefClient, timeout_s: float = 60.0) -> dict:
    """The canary once its rule decided: the decision runs in the background, not in the report."""
    deadline = time.monotonic() + timeout_s
    while (canary := api.canary(S))["state"] in ("running", "promoting") and time.monotonic() < deadline:
        time.sleep(0.1)
    return canary


def _routing_release(api: ReefClient, parent: str, started: dict, share: float) -> str:
    """Starting the canary appended a routing release on `parent`: the head's content, split."""
    routed = api.releases(S)["head"]
    assert started["head_release_id"] == routed["release_id"] and routed["parent_release_id"] == parent
    assert routed["operation"] == "route", routed
    arms = {a["arm"]: a for a in routed["routing"]["arms"]}
    assert arms["candidate"]["content_id"] == started["candidate_id"] and arms["candidate"]["share"] == share
    assert arms["head"]["content_id"] == routed["content_id"] == api.releases(S)["releases"][-2]["content_id"]
    return routed["release_id"]


def test_canary_splits_traffic_and_aborts_on_worse_rewards(gw: Gateway, api: ReefClient, ids: dict[str, str]) -> None:
    parent = head(api)
    started = api.start_canary(S, ids["canary"])
    assert started["state"] == "running" and started["fraction"] == FRACTION
    routed = _routing_release(api, parent, started, FRACTION)
    n = 60  # the candidate's share (0.3) holds MIN_REPORTS with p > 0.9999
    records = _canary_requests(gw, n)
    labels = Counter(release for _, release in records)
    assert set(labels) == {routed, f"{S}@canary-{ids['canary'][:12]}"}, labels
    sigma = math.sqrt(n * FRACTION * (1 - FRACTION))
    assert abs(labels[routed] - n * (1 - FRACTION)) < 4 * sigma, labels  # the configured share, within sampling error
    assert api.canary(S)["arms"]["candidate"]["requests"] == n - labels[routed]
    _report(gw, records, {"candidate": 0.0, "head": 1.0})
    canary = _decided(api)
    assert canary["state"] == "aborted" and "live reward" in canary["reason"], canary
    ended = api.releases(S)["head"]  # the abort is the next release: the head's content, no split
    assert (ended["parent_release_id"], ended["operation"], ended["routing"]) == (routed, "route", None), ended
    after = Counter(release for _, release in _canary_requests(gw, 10))
    assert set(after) == {ended["release_id"]}, after  # all traffic is back on the head


def test_a_canary_survives_a_restart_and_a_rollback_restores_it(gw: Gateway, api: ReefClient,
                                                                ids: dict[str, str]) -> None:
    """The split is the head's routing release: a restarted server applies it; the canary's numbers are
    counted again from the recorded experience; a rollback to that release splits traffic again."""
    parent = head(api)
    started = api.start_canary(S, ids["canary"], fraction=0.5)
    routed = _routing_release(api, parent, started, 0.5)
    records = _canary_requests(gw, 16)
    _report(gw, records[:8], {"candidate": 1.0, "head": 0.0})  # 8 reports: one arm has fewer than MIN_REPORTS
    before = api.canary(S)
    assert before["state"] == "running"
    gw.stop()
    gw.start()
    assert head(api) == routed
    after = api.canary(S)
    assert (after["canary_id"], after["state"], after["head_release_id"]) == (started["canary_id"], "running", routed)
    assert after["arms"] == before["arms"], (before, after)
    arm = f"{S}@canary-{ids['canary'][:12]}"
    labels = Counter(release for _, release in _canary_requests(gw, 20))
    assert set(labels) == {routed, arm}, labels  # the split is back
    assert api.stop_canary(S)["state"] == "aborted"
    ended = head(api)
    assert set(Counter(release for _, release in _canary_requests(gw, 6))) == {ended}

    restored = api.rollback(S, routed, ended)["release"]
    assert (restored["operation"], restored["restores"], restored["parent_release_id"]) == ("rollback", routed, ended)
    assert restored["routing"] == api.releases(S)["releases"][-3]["routing"]  # r(routed)'s split, as it was
    labels = Counter(release for _, release in _canary_requests(gw, 20))
    assert set(labels) == {restored["release_id"], arm}, labels
    again = api.canary(S)  # a canary of its own decides over the restored split
    assert (again["state"], again["head_release_id"]) == ("running", restored["release_id"])
    assert again["canary_id"] != started["canary_id"] and again["arms"]["candidate"]["requests"] == labels[arm]
    api.stop_canary(S)
    assert api.canary(S)["state"] == "aborted" and api.releases(S)["head"]["routing"] is None


def test_canary_promotes_on_better_rewards(gw: Gateway, api: ReefClient, ids: dict[str, str]) -> None:
    parent = head(api)
    routed = _routing_release(api, parent, api.start_canary(S, ids["canary"], fraction=0.5), 0.5)
    _report(gw, _canary_requests(gw, 40), {"candidate": 1.0, "head": 0.0})
    canary = _decided(api)
    assert canary["state"] == "promoted", canary
    release = api.releases(S)["head"]
    assert release["release_id"] == canary["release_id"] and release["parent_release_id"] == routed
    assert release["routing"] is None and release["operation"] == "promote" and release["content_id"] == ids["canary"]
    assert release["evaluation"]["canary"]["arms"]["candidate"]["reports"] >= MIN_REPORTS
    after = Counter(release for _, release in _canary_requests(gw, 5))
    assert set(after) == {release["release_id"]}, after


@pytest.mark.parametrize("point", ["release:loaded", "release:appended"])
def test_kill_9_during_a_swap_leaves_head_and_serving_in_agreement(gw: Gateway, api: ReefClient, ids: dict[str, str],
                                                                   probe: Probes, point: str) -> None:
    """`reef serve` killed while it publishes a full-weight rollback, after the engine took the new
    weights and before (or right after) the chain append. The session's vLLM outlives the gateway
    holding those weights; after a restart what answers, and what records say, is the chain's head."""
    messages, base_text, full_text = probe["full"]
    releases = api.releases(S)["releases"]
    if releases[-1]["content_id"] != releases[0]["content_id"]:  # start from the base weights
        api.rollback(S, f"{S}@r0", head(api), approved_by="pytest")
    before = head(api)
    full = next((r["release_id"] for r in releases if r["content_id"] == ids["full"]), None)
    gw.stop()
    gw.env["REEF_CRASH_AT"] = point
    gw.start()
    with pytest.raises(httpx.HTTPError):  # a rollback to it once it was released, else its release
        if full:
            api.rollback(S, full, before, approved_by="pytest")
        else:
            api.release(S, ids["full"], before, approved_by="pytest")
    assert gw.process is not None and gw.process.wait(timeout=60) == -9
    del gw.env["REEF_CRASH_AT"]
    gw.start()
    now = head(api)
    assert (now == before) == (point == "release:loaded")
    assert api.releases(S)["head"]["content_id"] == (ids["full"] if now != before else releases[0]["content_id"])
    text, record_id = ask(gw, messages)
    assert release_of(gw, record_id) == now
    assert text == (full_text if now != before else base_text), f"labelled {now} but answered {text!r}"
    serving = api.status()["scenarios"][S]["serving"]
    assert serving["release_id"] == now and serving["error"] is None
    if not full and now != before:  # the register says what the chain says
        assert {c["candidate_id"]: c for c in api.candidates(S)}[ids["full"]]["release_id"] == now
    if now != before:  # the base weights back, for whatever uses the session's vLLM next
        api.rollback(S, before, now, approved_by="pytest")
        assert ask(gw, messages)[0] == base_text
