"""The dashboard in a real browser: Debian's Chromium (`make chromium`) driven by Playwright against
`reef dashboard` (streamlit run) and a real `reef serve` in front of the session's vLLM.

It opens every page, approves the pending candidate (a LoRA trained for a few rft steps and
selected by the real gate) by clicking, checks through the API that the head moved and the server
serves it, and saves a screenshot of each page under test-artifacts/dashboard/. With
REEF_DASHBOARD_DOCS=1 the Candidates page is also saved as docs/dashboard-candidates.png (the
README's screenshot).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from reef.client import ReefClient
from reef.config import GateSettings
from reef.engine.supervisor import free_port
from reef.gate.evaluate import evaluate_candidate
from reef.registry.candidates import register_candidate
from tests.helpers import ARTIFACTS, MODEL_NAME, REPO, TINY
from tests.helpers.gateway import Gateway
from tests.helpers.releases import train_candidates
from tests.helpers.tiny import task as demo

os.environ.setdefault("OMP_NUM_THREADS", "1")
pytestmark = [pytest.mark.vllm, pytest.mark.start_early(8)]

S = demo.SCENARIO
TOKEN = "browser-admin-token"
SHOTS = ARTIFACTS / "dashboard"
PAGES = ["Overview", "Experience", "Candidates", "Release", "Lineage"]
DOCS = bool(os.environ.get("REEF_DASHBOARD_DOCS"))


def chromium() -> str:
    path = shutil.which("chromium")
    # Fail, never skip: the browser test is part of the suite (`make test` installs it).
    assert path, "chromium not found on PATH: run `make chromium` (Debian's chromium package via apt-get)"
    return path


@pytest.fixture(scope="module")
def server(vllm_url: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A gateway whose data dir holds a selected LoRA candidate and some served, rewarded traffic."""
    work = tmp_path_factory.mktemp("browser")
    lora = {"kind": "lora", "max_steps": 10, "learning_rate": 5e-3}
    cand = train_candidates(tiny_model, work / "train", {"lora": lora})["lora"]
    (work / "serve.yaml").write_text(yaml.safe_dump({
        "served_model_name": MODEL_NAME, "admin_token": TOKEN, "store": {"flush_interval_s": 0.2},
        "scenarios": {S: {"policy": "approval"}},
    }))
    view = register_candidate(work / "data", cand.path)
    result = evaluate_candidate(work / "data", view.candidate_id, GateSettings(samples=2), base_model=str(TINY),
                                progress=False)
    assert result.decision == "select", result.reason
    gw = Gateway(work, vllm_url, ["--model", str(TINY)]).start()
    client = gw.client(**{"x-reef-scenario": S})
    with httpx.Client(timeout=30) as http:  # one client: a new one per call costs ~40 ms CPU
        for task in demo.eval_tasks()[:24:2]:
            raw = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=task.messages,
                                                                   max_tokens=12, temperature=1.0)
            reply = raw.parse().choices[0].message.content or ""
            http.post(f"{gw.url}/reef/report", headers={"x-reef-scenario": S}, json={
                "agent_record_id": raw.headers["x-reef-agent-record-id"], "score": demo.score(task, reply)})
    yield {"gateway": gw, "data_dir": work / "data", "candidate": view.candidate_id}
    gw.stop()


@pytest.fixture(scope="module")
def dashboard(server: dict) -> Iterator[str]:
    """`reef dashboard` (streamlit run) on a free loopback port."""
    port = free_port()
    SHOTS.mkdir(parents=True, exist_ok=True)
    log = (SHOTS / "streamlit.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "reef.cli", "dashboard", "--data-dir", str(server["data_dir"]),
         "--url", server["gateway"].url, "--port", str(port)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "REEF_ADMIN_TOKEN": TOKEN},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=1) as http:
        while time.monotonic() < deadline:
            assert process.poll() is None, (SHOTS / "streamlit.log").read_text()[-3000:]
            try:
                if http.get(f"{url}/_stcore/health").text == "ok":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail("streamlit did not come up in 60 s")
    yield url
    process.terminate()
    process.wait(timeout=30)
    log.close()


SETTLED = """() => {
    const app = document.querySelector('[data-testid="stApp"]');
    if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
    if (document.querySelector('[data-testid="stSkeleton"]')) return false;
    const shown = sel => [...document.querySelectorAll(sel)].filter(e => e.checkVisibility());
    const grids = shown('[data-testid="stDataFrame"]');  // not those in collapsed expanders
    const charts = shown('[data-testid="stVegaLiteChart"]');
    return grids.every(g => g.querySelector('canvas')) && charts.every(c => c.querySelector('canvas, svg'));
}"""


def settle(page, title: str) -> None:  # noqa: ANN001 - playwright's Page
    """Wait until the page shows `title`, Streamlit has finished the script and tables and charts are drawn."""
    page.get_by_role("heading", name=title).wait_for(timeout=30_000)
    page.wait_for_function(SETTLED, timeout=30_000)
    page.wait_for_timeout(500)


def screenshot(page, path: Path, title: str, docs: Path | None = None) -> None:  # noqa: ANN001
    """The whole page: Streamlit scrolls inside its main block, so the window is grown to fit it.
    `docs`: also its top 1400 x 1500 pixels there."""
    height = page.evaluate("() => document.querySelector('[data-testid=\"stMainBlockContainer\"]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": max(1000, min(int(height) + 160, 8000))})
    settle(page, title)
    page.screenshot(path=str(path))
    if docs is not None:
        page.screenshot(path=str(docs), clip={"x": 0, "y": 0, "width": 1400, "height": 1500})
    page.set_viewport_size({"width": 1400, "height": 1000})


def test_every_page_and_approve_by_click(server: dict, dashboard: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(dashboard)
        for name in PAGES:
            if name != "Overview":
                page.locator('[data-testid="stSidebarNav"] a', has_text=name).click()
            settle(page, f"{name} · {S}")
            assert page.locator('[data-testid="stException"]').count() == 0, page.inner_text("body")[:2000]
            if name == "Lineage":
                page.locator('[data-testid="stGraphVizChart"] svg').wait_for(timeout=30_000)
            if name == "Overview":
                page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=30_000)
            docs = REPO / "docs" / "dashboard-candidates.png" if name == "Candidates" and DOCS else None
            screenshot(page, SHOTS / f"{name.lower()}.png", f"{name} · {S}", docs)

        # Approve the pending candidate on the Release page by clicking.
        page.locator('[data-testid="stSidebarNav"] a', has_text="Release").click()
        settle(page, f"Release · {S}")
        assert page.get_by_text(server["candidate"][:12]).count() >= 1
        page.get_by_role("button", name="Approve").click()
        page.get_by_text(f"as {S}@r1").wait_for(timeout=120_000)
        settle(page, f"Release · {S}")
        screenshot(page, SHOTS / "release-approved.png", f"Release · {S}")
        assert not errors, errors
        browser.close()

    with ReefClient(server["gateway"].url) as api:
        releases = api.releases(S)
        assert releases["head"]["release_id"] == f"{S}@r1"
        assert releases["head"]["content_id"] == server["candidate"]
        assert releases["head"]["approved_by"]  # who clicked
        assert releases["serving"]["release_id"] == f"{S}@r1"
        assert api.candidate(server["candidate"])["status"] == "released"
    # And the next request is answered by the new head and recorded under it.
    client = openai.OpenAI(base_url=f"{server['gateway'].url}/v1", api_key="unused", max_retries=0,
                           default_headers={"x-reef-scenario": S})
    raw = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=demo.eval_tasks()[0].messages,
                                                           max_tokens=8)
    record = httpx.get(f"{server['gateway'].url}/reef/records/{raw.headers['x-reef-agent-record-id']}",
                       headers={"x-reef-scenario": S}, timeout=30).json()
    assert record["release_id"] == f"{S}@r1"
