"""A learner round waits for enough signal: a minimum of eligible new records, and of them rewarded
and unrewarded ones (`learner.min_*`, or the recipe setting's), with the reason in the learner's
status, and starts once the reports reach every threshold. Real records and reports written
through the real experience store, the learner's real planner (`Learner.plan_tick`, what each tick
runs before it starts a round) and the real round entry point (`run_round`, which checks again); the
dashboard's overview shows the learner's reason. The same through a real gateway and vLLM, and the
round that starts once the reports reach the thresholds: tests/test_scenario_learning.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.config import ServeConfig
from reef.experience.store import ExperienceStore
from reef.learn.learner import Learner
from reef.learn.plan import Thresholds, thresholds
from reef.learn.round import run_round
from tests.helpers.records import MANUAL, make_record, make_report

pytestmark = pytest.mark.model_free

S = "support"


def _config(data: Path, recipe: dict, **learner: int) -> ServeConfig:
    return ServeConfig(data_dir=data, learner={"enabled": True, **learner}, recipes={"mine": recipe},
                       scenarios={S: {"recipe": "mine"}})


def _write(data: Path, first: int, scores: list[float | None]) -> None:
    """Records `first`, `first + 1`, ... of scenario S, each reported with its score (None: no report)."""
    with ExperienceStore(data, MANUAL) as store:
        records = [make_record(first + i, scenario=S, release=f"{S}@r0") for i in range(len(scores))]
        store.append_records_sync(records)
        store.append_reports_sync([make_report(f"rep_{r.record_id}", [r.record_id], score, scenario=S)
                                   for r, score in zip(records, scores, strict=True) if score is not None])
        store.flush()


def test_defaults_wait_for_signal_and_each_recipe_for_what_it_learns_from(tmp_path: Path) -> None:
    config = ServeConfig(data_dir=tmp_path, recipes={
        "rl": {"recipe": "online_rl"}, "rft": {"recipe": "rft"}, "nt": {"recipe": "next_turn"},
        "evolve": {"recipe": "harness_evolve"}, "strict-rft": {"recipe": "rft", "min_records": 8,
                                                              "min_unrewarded": 2}},
        scenarios={name: {"recipe": name} for name in ("rl", "rft", "nt", "evolve", "strict-rft")})
    assert (config.learner.min_records, config.learner.min_rewarded, config.learner.min_unrewarded) == (16, 4, 4)
    plans = Learner(config).scenarios
    got = {name: plans[name].thresholds for name in plans}
    assert got == {
        "rl": Thresholds(records=16, rewarded=4, unrewarded=4),  # a group baseline needs both
        "rft": Thresholds(records=4, rewarded=4),  # trains on the rewarded ones only: min_rewarded of them
        "nt": Thresholds(records=16),  # its rewards are next turns, not reports
        "evolve": Thresholds(records=16, unrewarded=4),  # learns from failures
        "strict-rft": Thresholds(records=8, rewarded=4, unrewarded=2),  # the recipe setting's own, named
    }
    assert all(plans[name].plan.wait_for == got[name] for name in plans)  # the round process checks them too
    assert thresholds(config, "rft") == Thresholds(records=16, rewarded=4, unrewarded=4)  # no recipe: every count
    # min_records set by the user is theirs, also for a recipe that learns from rewarded records only.
    named = ServeConfig(data_dir=tmp_path, learner={"min_records": 16}, recipes={"rft": {"recipe": "rft"}},
                        scenarios={"rft": {"recipe": "rft"}})
    assert Learner(named).scenarios["rft"].thresholds == Thresholds(records=16, rewarded=4)


def test_no_round_below_the_thresholds_and_status_names_the_reason(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # online_rl: groups by prompt (every test record shares one), rewarded above 0.
    config = _config(data, {"recipe": "online_rl", "params": {"max_steps": 1}},
                     min_records=6, min_rewarded=3, min_unrewarded=2)
    _write(data, 0, [1.0, 0.5, 0.0, None])  # one record still unreported: not eligible
    learner = Learner(config)
    state = learner.scenarios[S]

    assert learner.plan_tick() is None
    reason = "waiting: 2 of 3 rewarded, 1 of 2 unrewarded, 3 of 6 records"
    status = learner.describe()
    mine = status["scenarios"][S]
    assert mine["waiting"] == reason and status["waiting"] == {S: reason}
    assert mine["thresholds"] == {"records": 6, "rewarded": 3, "unrewarded": 2} and mine["min_records"] == 6
    assert (mine["pending"]["records"], mine["pending"]["rewarded"], mine["pending"]["unrewarded"]) == (3, 2, 1)
    assert mine["pending"]["unreported"] == 1 and mine["round"] is None and mine["rounds"] == 0

    # The round itself refuses too (what the learner's round process runs): it begins nothing.
    result = run_round(state.plan).model_dump(mode="json")
    assert (result["status"], result["reason"]) == ("waiting", reason)
    assert state.log.rounds() == [] and not (data / "snapshots").exists()

    # Enough records and rewarded ones, still one unrewarded short: it keeps waiting, and says so.
    _write(data, 10, [1.0, 1.0, 0.25])
    assert learner.plan_tick() is None
    short = "waiting: 5 of 3 rewarded, 1 of 2 unrewarded, 6 of 6 records"
    assert learner.describe()["scenarios"][S]["waiting"] == short

    # The second failure reported: every count reached, the round is due, nothing waits.
    _write(data, 20, [0.0])
    assert learner.plan_tick() == S
    status = learner.describe()
    assert status["scenarios"][S]["waiting"] is None and status["waiting"] == {}
    assert status["scenarios"][S]["pending"]["records"] == 7


def test_rft_counts_what_its_min_score_keeps_and_waits_for_no_failures(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = _config(data, {"recipe": "rft"}, min_records=3, min_rewarded=3)
    _write(data, 0, [1.0, 1.0, 0.5, 0.0])  # rft's min_score 1.0: 0.5 is unrewarded, not trained on
    learner = Learner(config)
    assert learner.plan_tick() is None
    mine = learner.describe()["scenarios"][S]
    assert mine["waiting"] == "waiting: 2 of 3 rewarded, 2 of 3 records"
    assert (mine["pending"]["rewarded"], mine["pending"]["unrewarded"], mine["pending"]["below_min_score"]) == (2, 2, 2)
    _write(data, 10, [1.0])  # the third success: due, with no minimum of failures asked for
    assert learner.plan_tick() == S and learner.scenarios[S].waiting is None


def test_a_batch_smaller_than_min_records_does_not_stall_the_round(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # One round takes 2 samples (newest first); the threshold counts every eligible record, not one round's.
    config = _config(data, {"recipe": "rft", "batch_size": 2}, min_records=3, min_rewarded=3)
    _write(data, 0, [1.0, 1.0])
    learner = Learner(config)
    assert learner.plan_tick() is None
    assert learner.describe()["scenarios"][S]["waiting"] == "waiting: 2 of 3 rewarded, 2 of 3 records"
    _write(data, 10, [1.0, 1.0])
    assert learner.plan_tick() == S
    pending = learner.scenarios[S].pending
    assert pending is not None
    assert (pending["records"], pending["eligible"], pending["over_batch_deferred"]) == (2, 4, 2)


def test_the_dashboard_shows_why_the_round_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import streamlit as st

    from tests.helpers.dashboard import app, texts

    data = tmp_path / "data"
    config = _config(data, {"recipe": "online_rl"}, min_records=6, min_rewarded=3, min_unrewarded=2)
    _write(data, 0, [1.0, 0.0, 0.0])
    learner = Learner(config)
    assert learner.plan_tick() is None
    body = json.dumps({"learner": learner.describe(), "scenarios": {}}).encode()

    class Status(BaseHTTPRequestHandler):  # what `GET /reef/status` answers with this learner
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200 if self.path == "/reef/status" else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body if self.path == "/reef/status" else b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Status)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        st.cache_data.clear()
        at = app(monkeypatch, data, f"http://127.0.0.1:{server.server_address[1]}")
        at.selectbox(key="scenario_picker").set_value(S).run()
        shown = texts(at, "caption") + texts(at, "markdown")
        assert any("waiting: 1 of 3 rewarded, 2 of 2 unrewarded, 3 of 6 records" in t for t in shown), shown
        assert any("starts at 6 records, 3 rewarded, 2 unrewarded" in t for t in shown), shown
    finally:
        server.shutdown()


def test_a_round_that_finds_nothing_new_waits_for_min_records_more(tmp_path: Path) -> None:
    """A harness round over failures that teach nothing (no recurring feedback, no corrections) ends
    `nothing_new` and consumes nothing; the learner does not ask again about the same failures every
    interval, it waits until min_records more records arrived, and says so. The real round process."""
    import yaml

    from reef.config import resolve

    data = tmp_path / "data"
    model = tmp_path / "model"  # the round registers the base as r0; a harness round loads no weights
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"not read")
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump({
        "data_dir": str(data), "model": str(model), "learner": {"enabled": True, "min_records": 4, "min_unrewarded": 2},
        "recipes": {"mine": {"recipe": "harness_evolve", "params": {"proposer": "mined"}}},
        "scenarios": {S: {"recipe": "mine"}}}))
    config, _ = resolve(config_file=tmp_path / "serve.yaml")
    _write(data, 0, [0.0] * 4)
    learner = Learner(config)
    assert learner.tick() == S
    state = learner.scenarios[S]
    assert state.last is not None and state.last["status"] == "nothing_new" and state.idle_at == 4
    assert learner.plan_tick() is None
    assert state.waiting == "waiting: 4 of 8 records (the last round found nothing new to learn)"
    _write(data, 10, [0.0] * 3)
    assert learner.plan_tick() is None and state.waiting.startswith("waiting: 7 of 8 records")
    _write(data, 20, [0.0])
    assert learner.plan_tick() == S and state.waiting is None and state.idle_at is None
