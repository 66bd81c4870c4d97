"""The dashboard's pages under Streamlit's AppTest: against a fixture store (records, reports and
gated candidates written through reef.experience and reef.registry) and a real `reef serve` in
front of the session's vLLM, which the Release page acts on through the release API.

The candidates are real LoRA adapters (randomly initialised, not trained: the gate's verdict is
written as a synthetic GateResult), so a release swaps them into vLLM for real.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
import streamlit as st

from dashboard import data, graph
from dashboard.synthetic import gate_result, make_harness_candidate, make_lora_candidate, write_records, write_store
from reef.client import ReefClient
from reef.experience import load
from reef.registry import ReleaseChain, Routing
from reef.registry.base_model import ensure_scenario
from reef.registry.candidates import CandidateRegistry, register_candidate
from tests.helpers.dashboard import app, texts
from tests.helpers.gateway import Gateway

SCENARIO = "demo-add"
TOKEN = "dash-token"
RECORDS = 600


def serve(work: Path, vllm_url: str, tiny_model: Path, env: dict[str, str] | None = None) -> Gateway:
    """A gateway in front of the session's vLLM that can release: it knows the base model's folder
    (releases are content-addressed against it) and serves it under vLLM's name."""
    return Gateway(work, vllm_url, ["--model", str(tiny_model)],
                   env={"REEF_ADMIN_TOKEN": TOKEN, "REEF_SERVED_MODEL_NAME": "reef-tiny", **(env or {})})


@pytest.fixture(scope="module")
def served(vllm_url: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A data dir with experience and three selected LoRA candidates, served by a real gateway."""
    work = tmp_path_factory.mktemp("dashboard")
    data_dir = work / "data"
    ensure_scenario(data_dir, SCENARIO, str(tiny_model))  # r0: the base model the server runs
    write_records(data_dir, SCENARIO, [f"{SCENARIO}@r0"], RECORDS, hours=2.0)  # before the server locks the store
    ids = []
    for seed in (1, 2, 3):  # approve, reject, canary
        folder = make_lora_candidate(tiny_model, work / f"lora-{seed}", SCENARIO, seed=seed)
        view = register_candidate(data_dir, folder)
        CandidateRegistry(data_dir, SCENARIO).record_gate(
            view.candidate_id, gate_result(f"{SCENARIO}@r0", success=0.8, head_success=0.3, seed=seed))
        ids.append(view.candidate_id)
    gw = serve(work, vllm_url, tiny_model).start()
    yield {"data_dir": data_dir, "url": gw.url, "candidates": ids, "gateway": gw}
    gw.stop()


@pytest.fixture(autouse=True)
def fresh_caches() -> None:
    st.cache_data.clear()
    st.cache_resource.clear()


@pytest.mark.vllm
def test_overview(served: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(monkeypatch, served["data_dir"], served["url"])
    assert at.title[0].value == f"Overview · {SCENARIO}"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Records"] == f"{RECORDS:,}"
    assert metrics["Head"] == f"{SCENARIO}@r0"
    assert len(at.get("vega_lite_chart")) == 2  # traffic and reward over time
    # Learner status comes from the live server (off in this one); gate decisions from the register.
    assert any("learner is off" in c for c in texts(at, "caption"))
    gates = at.dataframe[-1].value
    assert sorted(gates["candidate"]) == sorted(c[:12] for c in served["candidates"])
    assert set(gates["decision"]) == {"select"}


@pytest.mark.vllm
def test_experience_filters_session_and_export(served: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(monkeypatch, served["data_dir"], served["url"], "experience")
    assert f"**{RECORDS:,}** of {RECORDS:,} records match" in texts(at, "markdown")
    table = at.dataframe[0].value
    assert len(table) == 50  # one page, never the whole store
    assert table["created_at"].is_monotonic_decreasing

    at.radio(key="exp_scored").set_value("scored").run()
    scored = int(next(t for t in texts(at, "markdown") if "records match" in t).split("**")[1].replace(",", ""))
    frame = load(SCENARIO, served["data_dir"]).collect()
    assert scored == frame.filter(pl.col("score").is_not_null()).height

    # Open one session as a conversation, with its reports and token-level details.
    session = frame.filter(pl.col("score").is_not_null())["gen_ai.conversation.id"][0]
    at.text_input(key="exp_text").input(session).run()
    assert at.selectbox(key="exp_session").value == session
    turns = frame.filter(pl.col("gen_ai.conversation.id") == session)
    assistant = [m for m in at.chat_message if m.name == "assistant" and m.markdown and
                 m.markdown[0].value.startswith("Answer:")]
    assert len(assistant) == turns.height
    assert any(e.label.startswith("Tokens (") for e in at.expander)
    assert any(i.value.startswith("report ") for i in at.info)

    # Export: the filtered set, every column, as parquet.
    assert at.get("download_button")
    exported = pl.read_parquet(io.BytesIO(data.export_parquet(
        served["data_dir"], SCENARIO, data.Filters(scored="scored"))))
    assert exported.height == scored and {"messages", "choices", "score", "staleness"} <= set(exported.columns)


@pytest.mark.vllm
def test_candidates_compare_with_head(served: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(monkeypatch, served["data_dir"], served["url"], "candidates")
    listed = at.dataframe[0].value
    assert sorted(listed["candidate"]) == sorted(c[:12] for c in served["candidates"])
    labels = [m.label for m in at.metric]
    assert "Candidate success" in labels and "Delta, 95% CI" in labels
    per_prompt = at.dataframe[1].value
    order = [{"win": 0, "loss": 1, "tie": 2}[o] for o in per_prompt["outcome"]]
    assert order == sorted(order), "wins first, then losses, then ties"
    at.segmented_control(key="cand_outcome").set_value("loss").run()
    assert set(at.dataframe[1].value["outcome"]) <= {"loss"}


@pytest.mark.vllm
def test_release_approve_reject_rollback_and_conflict(served: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second, _ = served["candidates"]
    at = app(monkeypatch, served["data_dir"], served["url"], "release")
    assert {m.label: m.value for m in at.metric}["Head"] == f"{SCENARIO}@r0"

    # Without the token the server refuses, and the page says why.
    at.button(key=f"approve_{first}").click().run()
    assert any("admin token" in e for e in texts(at, "error"))
    at.text_input(key="admin_token_input").input(TOKEN).run()

    # Approve: the same release API, with the head the page showed as expected parent.
    at.button(key=f"approve_{first}").click().run()
    assert any(f"as {SCENARIO}@r1" in s for s in texts(at, "success")), texts(at, "error")
    assert {m.label: m.value for m in at.metric}["Head"] == f"{SCENARIO}@r1"
    with ReefClient(served["url"], admin_token=TOKEN) as client:
        assert client.releases(SCENARIO)["serving"]["release_id"] == f"{SCENARIO}@r1"
        # Someone else moves the head (a rollback to r0 makes r2) after the page showed r1 ...
        client.rollback(SCENARIO, f"{SCENARIO}@r0", expected_parent=f"{SCENARIO}@r1", approved_by="other")
    # ... so approving the second candidate from this page is refused, plainly, and nothing changes.
    at.button(key=f"approve_{second}").click().run()
    error = " ".join(texts(at, "error"))
    assert "head moved" in error and f"{SCENARIO}@r2" in error
    with ReefClient(served["url"]) as client:
        assert client.head(SCENARIO) == f"{SCENARIO}@r2"
        assert client.candidate(second)["status"] == "selected"
    assert {m.label: m.value for m in at.metric}["Head"] == f"{SCENARIO}@r2"  # the page shows the new head

    # Reject, with a reason.
    at.text_input(key=f"reason_{second}").input("too risky").run()
    at.button(key=f"reject_{second}").click().run()
    assert any("Rejected" in s for s in texts(at, "success"))
    view = CandidateRegistry(served["data_dir"], SCENARIO).get(second)
    assert (view.status, view.reject_reason) == ("rejected", "too risky")

    # Roll back to r1 (the first candidate) from the page.
    at.selectbox(key="rollback_target").set_value(f"{SCENARIO}@r1").run()
    at.button(key="rollback_button").click().run()
    assert any(f"{SCENARIO}@r3" in s for s in texts(at, "success")), texts(at, "error")
    with ReefClient(served["url"]) as client:
        releases = client.releases(SCENARIO)
    assert releases["head"]["restores"] == f"{SCENARIO}@r1" and releases["serving"]["release_id"] == f"{SCENARIO}@r3"


@pytest.mark.vllm
def test_release_page_runs_a_canary(served: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    third = served["candidates"][2]
    at = app(monkeypatch, served["data_dir"], served["url"], "release", token=TOKEN)
    at.selectbox(key="canary_candidate").set_value(third).run()
    at.number_input(key="canary_fraction").set_value(0.5).run()
    at.button(key="canary_start").click().run()
    assert any("Canary of" in s for s in texts(at, "success")), texts(at, "error")
    with ReefClient(served["url"]) as client:
        canary = client.releases(SCENARIO)["serving"]["canary"]
    assert (canary["state"], canary["candidate_id"], canary["fraction"]) == ("running", third, 0.5)

    chat = served["gateway"].client(**{"x-reef-scenario": SCENARIO})
    for i in range(12):
        chat.chat.completions.create(model="reef-tiny", messages=[{"role": "user", "content": f"What is {i} + 1?"}],
                                     max_tokens=4)
    at.run()  # the page shows both arms' live numbers
    arms = next(d.value for d in at.dataframe if "arm" in d.value.columns)
    requests = dict(zip(arms["arm"], arms["requests"], strict=True))
    assert sum(requests.values()) == 12 and requests["candidate"] > 0, requests

    at.button(key="canary_abort").click().run()
    assert any("Canary aborted" in s for s in texts(at, "success")), texts(at, "error")
    with ReefClient(served["url"]) as client:
        canary = client.releases(SCENARIO)["serving"]["canary"]
    assert canary["state"] == "aborted"
    assert at.button(key="canary_start")  # the page offers a new canary


def _harness_candidate(data_dir: Path, work: Path, name: str, rule: str, head: dict) -> str:
    """A harness candidate (a harness recipe's folder) adding `rule` to the head's harness, registered
    and selected by a (synthetic) gate result against the head."""
    files = {"system.md": "You add numbers.\n", "rules.md": f"{rule}\n"}
    mutations = [{"op": "create", "path": "rules.md", "reason": "feedback", "content": rule}]
    folder = make_harness_candidate(work / name, SCENARIO, files, parent_release=head["release_id"],
                                    parent_harness=head.get("harness_id"), mutations=mutations)
    view = register_candidate(data_dir, folder)
    select(data_dir, view.candidate_id, head["release_id"])
    return view.candidate_id


def select(data_dir: Path, candidate_id: str, head_release_id: str) -> None:
    CandidateRegistry(data_dir, SCENARIO).record_gate(
        candidate_id, gate_result(head_release_id, success=0.8, head_success=0.3, seed=7))


@pytest.mark.vllm
def test_release_page_releases_harness_candidates(served: dict, tiny_model: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Harness candidates are approved, rejected, released with weights (composite) and rolled back
    from the page, through the same release API as weights; harness releases show their diffs."""
    data_dir = served["data_dir"]
    with ReefClient(served["url"], admin_token=TOKEN) as client:
        head = client.releases(SCENARIO)["head"]
        if head.get("routing"):  # a canary left running by another test: end its split first
            client.stop_canary(SCENARIO)
            head = client.releases(SCENARIO)["head"]
    first = _harness_candidate(data_dir, tmp_path, "h1", "Reply with the number only.", head)
    spare = _harness_candidate(data_dir, tmp_path, "h3", "Never answer.", head)
    at = app(monkeypatch, data_dir, served["url"], "release", token=TOKEN)
    expander = next(e for e in at.expander if e.label == "Harness diff" and any(
        "+Reply with the number only." in c.value for c in e.code))
    assert expander  # the waiting harness candidate shows what it changes

    at.button(key=f"approve_{first}").click().run()  # a harness release: the head's weights stay
    assert any("Released" in s for s in texts(at, "success")), texts(at, "error")
    with ReefClient(served["url"]) as client:
        harnessed = client.releases(SCENARIO)["head"]
    assert (harnessed["harness_id"], harnessed["content_id"]) == (first, head["content_id"])
    shown = next(e for e in at.expander if e.label.startswith(f"{harnessed['release_id']} · harness"))
    assert any("+Reply with the number only." in c.value for c in shown.code)  # the release's diff

    at.text_input(key=f"reason_{spare}").input("tells it never to answer").run()
    at.button(key=f"reject_{spare}").click().run()
    assert CandidateRegistry(data_dir, SCENARIO).get(spare).status == "rejected"

    # Weights and another harness in one composite release, both gated against what serves now.
    lora = register_candidate(data_dir, make_lora_candidate(tiny_model, tmp_path / "lora", SCENARIO, seed=5))
    select(data_dir, lora.candidate_id, harnessed["release_id"])
    second = _harness_candidate(data_dir, tmp_path, "h2", "Reply as 'Answer: <n>'.", harnessed)
    at.run()
    at.selectbox(key="release_candidate").set_value(lora.candidate_id).run()
    at.selectbox(key="release_harness").set_value(second).run()
    at.button(key="release_button").click().run()
    assert any("with harness" in s for s in texts(at, "success")), texts(at, "error")
    with ReefClient(served["url"]) as client:
        composite = client.releases(SCENARIO)["head"]
    assert (composite["content_id"], composite["harness_id"]) == (lora.candidate_id, second)
    table = next(d.value for d in at.dataframe if "change" in d.value.columns)
    assert list(table["change"])[0] == "composite" and "harness" in set(table["change"])

    # Roll back to the harness release: its weights and harness serve again.
    at.selectbox(key="rollback_target").set_value(harnessed["release_id"]).run()
    at.button(key="rollback_button").click().run()
    assert any("Rolled back" in s for s in texts(at, "success")), texts(at, "error")
    with ReefClient(served["url"]) as client:
        back = client.releases(SCENARIO)
    assert (back["head"]["content_id"], back["head"]["harness_id"]) == (head["content_id"], first)
    assert back["serving"]["release_id"] == back["head"]["release_id"]


@pytest.mark.vllm
def test_lineage_graph(served: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    first = served["candidates"][0]
    with ReefClient(served["url"], admin_token=TOKEN) as client:  # r1 is the first candidate's release
        if f"{SCENARIO}@r1" not in {r["release_id"] for r in client.releases(SCENARIO)["releases"]}:
            client.release(SCENARIO, first, expected_parent=client.head(SCENARIO) or "", approved_by="test")
    at = app(monkeypatch, served["data_dir"], served["url"], "lineage")
    at.selectbox(key="lineage_release").set_value(f"{SCENARIO}@r1").run()
    assert not at.exception, at.exception
    dot = at.get("graphviz_chart")[0].proto.spec
    assert f"candidate {first[:12]}" in dot and f"{SCENARIO}-synthetic-1" in dot  # candidate, snapshot
    assert "dashboard.synthetic:make_lora_candidate" in dot and f'"{SCENARIO}@r0"' in dot  # recipe, parent
    assert "dvc stage: base-model" in dot  # the repository's dvc.lock


# --- without a server: a synthetic store with a harness chain ---------------------------------------


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_store(tmp_path_factory.mktemp("synthetic") / "data", records=3000, releases=3).data_dir


def test_every_page_renders_without_a_server(synthetic: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(monkeypatch, synthetic, "http://127.0.0.1:9")
    for page in ("experience", "candidates", "release", "lineage"):
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, (page, at.exception)
        assert at.title[0].value.endswith(SCENARIO)
    at.switch_page("views/release.py").run()
    assert any("does not answer" in w for w in texts(at, "warning"))
    assert all(b.disabled for b in at.button if b.label in ("Approve", "Reject", "Rollback", "Release"))


def test_harness_candidate_shows_a_diff(synthetic: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(monkeypatch, synthetic, "http://127.0.0.1:9", "candidates")
    diffs = [c.value for c in at.code if c.language == "diff"]
    assert diffs and "-You add numbers" in diffs[0] and "+You add numbers" in diffs[0] and "Variant" in diffs[0]
    assert "parent/rules.md" in diffs[0] and "+Check the sum twice" in diffs[0]  # against the harness it mutated
    mutations = next(d.value for d in at.dataframe if "op" in d.value.columns)  # what the recipe proposed
    assert list(mutations["path"]) == ["system.md", "rules.md"] and "wrong sum" in mutations["reason"].iloc[1]


def test_release_page_lists_harness_releases_with_diffs(synthetic: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(monkeypatch, synthetic, "http://127.0.0.1:9", "release")
    table = next(d.value for d in at.dataframe if "change" in d.value.columns)
    assert list(table["change"]) == ["harness", "harness", "base"] and table["harness"][2] == "-"
    releases = [e for e in at.expander if e.label.startswith(f"{SCENARIO}@r")]
    assert [e.label.split(" · ")[:2] for e in releases] == [[f"{SCENARIO}@r{i}", "harness"] for i in (2, 1)]
    newest = releases[0].code[0].value
    assert f"--- {SCENARIO}@r1/system.md" in newest and "-You add numbers. Reply as 'Answer: <number>'. Think step 1" \
        in newest and "+You add numbers. Reply as 'Answer: <number>'. Think step 2" in newest
    first = releases[1].code[0].value  # r1's parent r0 serves no harness: every file is new
    assert "--- /dev/null" in first and "+++ demo-add@r1/skills/add/SKILL.md" in first
    assert [e.label for e in at.expander if e.label == "Harness diff"]  # the selected harness candidate waits


def test_lineage_dot_is_valid_for_a_rollback(synthetic: Path) -> None:
    chain = [json.loads(line) for line in (synthetic / "releases" / SCENARIO / "chain.jsonl").read_text().splitlines()]
    dot = graph.lineage_dot(chain, chain[-1]["release_id"], 5, {}, {}, {})
    assert dot.startswith("digraph lineage {") and dot.rstrip().endswith("}")
    assert dot.count('"parent"') == len(chain) - 1


def test_lineage_dot_shows_the_harness_and_a_canary_arm(tmp_path: Path) -> None:
    def cid(name: str) -> str:
        return hashlib.sha256(name.encode()).hexdigest()

    chain = ReleaseChain(tmp_path, SCENARIO)
    r0 = chain.ensure_base(cid("base"))
    routing = Routing.canary(SCENARIO, r0.content_id, "full", cid("lora"), 0.25)
    chain.publish(r0.release_id, r0.content_id, "full", "route", harness_id=cid("tree"), routing=routing)
    dot = graph.lineage_dot([r.model_dump(mode="json") for r in chain.releases()], f"{SCENARIO}@r1", 5, {}, {}, {})
    assert f'"content:{cid("tree")}"' in dot and '"harness"' in dot
    assert f'"content:{cid("lora")}"' in dot and '"canary 25%"' in dot


def test_candidate_training_curves(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-step log a recipe keeps in candidate.json reaches the registry and is plotted."""
    data_dir = tmp_path / "data"
    ensure_scenario(data_dir, SCENARIO, str(tiny_model))
    view = register_candidate(data_dir, make_lora_candidate(tiny_model, tmp_path / "lora", SCENARIO, seed=4))
    assert [r["step"] for r in view.training_log] == list(range(1, 21))
    curves = data.training_curves(view.training_log + [{"step": 21, "epoch": 1.0, "loss": 0.1}])
    assert set(curves["metric"]) == {"loss", "reward", "grad_norm", "learning_rate"}  # epoch is no curve
    at = app(monkeypatch, data_dir, "http://127.0.0.1:9", "candidates")
    assert not at.exception
    assert at.multiselect(key="cand_curves").value == ["loss", "reward", "grad_norm", "learning_rate"]
    at.multiselect(key="cand_curves").set_value(["loss"]).run()
    assert not at.exception and "Training curves" in [h.value for h in at.subheader]
