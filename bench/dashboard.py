"""How long each dashboard page takes to render with 100,000 records in the store.

    .venv/bin/python bench/dashboard.py [--records 100000] [--data-dir DIR] [--repeat 3] [--no-browser]

Writes `--records` synthetic records (sessions, reports, four releases, gated harness candidates)
through `reef.experience.store.ExperienceStore` and `reef.registry` into a temporary data dir (or
reuses `--data-dir` when it already holds them), then times every page twice:

  script   Streamlit's `AppTest` runs the page as `streamlit run` does (server side only)
  Chromium a real `streamlit run` and Debian's Chromium (Playwright): from a click on the page's
           sidebar link until the script has finished and every visible table and chart is drawn

  cold     the page's queries run on the parquet shards: caches cleared (AppTest), or a fresh
           `streamlit run` whose imports and frontend start were paid by opening another page first
  warm     the page again with the caches holding its data (a click, a filter change, a revisit)

Imports (polars, datasets, altair) are paid once per server process and excluded from the figures;
the first AppTest run reports that cost. No `reef serve` is needed: the Release page's live state
shows "not reachable" after one refused connection.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `dashboard` is a folder at the repository root, not part of the package
APP = REPO / "dashboard" / "app.py"

from bench.results import add_flag, publish  # noqa: E402

PAGES = ["overview", "experience", "candidates", "release", "lineage"]
BUDGET_S = 2.0


def build(data_dir: Path, records: int) -> None:
    from dashboard.synthetic import write_store

    started = time.perf_counter()
    store = write_store(data_dir, records=records)
    print(f"wrote {store.records:,} records and {store.reports:,} reports in {time.perf_counter() - started:.1f} s "
          f"to {data_dir}")


def render(page: str, *, clear: bool) -> tuple[float, float]:
    """(cold, warm) seconds of one page in a new AppTest session."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=120)
    if page != "overview":
        at.run()  # lands on the default page; the switch below is what is timed
        at.switch_page(f"views/{page}.py")
    if clear:
        st.cache_data.clear()
        st.cache_resource.clear()
    started = time.perf_counter()
    at.run()
    cold = time.perf_counter() - started
    if at.exception:
        raise RuntimeError(f"{page}: {at.exception[0].value}")
    started = time.perf_counter()
    at.run()
    return cold, time.perf_counter() - started


# Streamlit finished the script, and every visible table and chart is drawn.
SETTLED = """() => {
    const app = document.querySelector('[data-testid="stApp"]');
    if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
    if (document.querySelector('[data-testid="stSkeleton"]')) return false;
    const shown = sel => [...document.querySelectorAll(sel)].filter(e => e.checkVisibility());
    return shown('[data-testid="stDataFrame"]').every(g => g.querySelector('canvas'))
        && shown('[data-testid="stVegaLiteChart"]').every(c => c.querySelector('canvas, svg'));
}"""


def browser(data_dir: Path, repeat: int) -> dict[str, dict[str, float]]:
    """Per page: seconds from a click on its sidebar link until it is drawn in Chromium. Each
    repeat starts a fresh `streamlit run`, opens the other pages (imports, the frontend's start and
    its chart and table code), ends on one that shares no query with the measured page and clicks
    Refresh (every cache dropped); cold is then the measured page's first visit, warm a revisit."""
    import httpx
    from playwright.sync_api import sync_playwright

    from reef.engine.supervisor import free_port

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium not found: `make chromium`, or pass --no-browser")
    out: dict[str, dict[str, float]] = {}
    with sync_playwright() as p:
        engine = p.chromium.launch(executable_path=chromium)

        def drawn(tab, page: str) -> None:  # noqa: ANN001
            tab.get_by_role("heading", name=f"{page.capitalize()} · ").wait_for(timeout=60_000)
            tab.wait_for_function(SETTLED, timeout=60_000)

        def click(tab, page: str) -> float:  # noqa: ANN001
            started = time.perf_counter()
            tab.locator('[data-testid="stSidebarNav"] a', has_text=page.capitalize()).click()
            drawn(tab, page)
            return time.perf_counter() - started

        for page in PAGES:
            # The page the warm-up ends on: it must not cache what `page` reads.
            other = "experience" if page in ("release", "candidates", "lineage") else "release"
            cold, warm = [], []
            for _ in range(repeat):
                port = free_port()
                server = subprocess.Popen(
                    [sys.executable, "-m", "streamlit", "run", str(APP), "--server.address", "127.0.0.1",
                     "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
                     "--", "--data-dir", str(data_dir), "--url", "http://127.0.0.1:9"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                url = f"http://127.0.0.1:{port}"
                try:
                    for _ in range(300):
                        try:
                            if httpx.get(f"{url}/_stcore/health", timeout=1).text == "ok":
                                break
                        except httpx.HTTPError:
                            time.sleep(0.1)
                    tab = engine.new_page(viewport={"width": 1400, "height": 1000})
                    tab.goto(url)
                    drawn(tab, "overview")
                    for warmup in ("candidates", "lineage", other):
                        click(tab, warmup)
                    tab.get_by_role("button", name="Refresh").click()
                    tab.wait_for_timeout(300)
                    drawn(tab, other)
                    cold.append(click(tab, page))
                    click(tab, other)
                    warm.append(click(tab, page))
                    tab.close()
                finally:
                    server.terminate()
                    server.wait(timeout=30)
            out[page] = {"browser_cold_s": statistics.median(cold), "browser_cold_max_s": max(cold),
                         "browser_warm_s": statistics.median(warm)}
        engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--data-dir", type=Path, help="reuse (or create) this data dir instead of a temporary one")
    parser.add_argument("--repeat", type=int, default=3, help="cold renders per page; the median is reported")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "dashboard.json")
    parser.add_argument("--no-browser", action="store_true", help="skip the Chromium measurement")
    add_flag(parser)
    args = parser.parse_args()
    os.environ.setdefault("STREAMLIT_LOGGER_LEVEL", "error")  # AppTest warns "no runtime" on every run
    logging.getLogger("streamlit").setLevel(logging.ERROR)

    tmp = None
    data_dir = args.data_dir
    if data_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="reef-dashboard-bench-"))
        data_dir = tmp / "data"
    try:
        if not (data_dir / "experience").is_dir():
            build(data_dir, args.records)
        os.environ.update(REEF_DATA_DIR=str(data_dir), REEF_URL="http://127.0.0.1:9")  # nothing listens there
        started = time.perf_counter()
        render("overview", clear=True)
        print(f"first render in a new process (imports included): {time.perf_counter() - started:.2f} s")
        results = {}
        for page in PAGES:
            runs = [render(page, clear=True) for _ in range(args.repeat)]
            results[page] = {"cold_s": statistics.median(r[0] for r in runs),
                             "cold_max_s": max(r[0] for r in runs),
                             "warm_s": statistics.median(r[1] for r in runs)}
        if not args.no_browser:
            for page, times in browser(data_dir, args.repeat).items():
                results[page].update(times)
        import polars as pl

        records = pl.scan_parquet(str(data_dir / "experience" / "*" / "records" / "*.parquet")).select(pl.len())
        n = records.collect().item()
        title = f"{n:,} records; median of {args.repeat} renders per page (budget {BUDGET_S:.0f} s)"
        print(f"\n{title}\n")
        lines = [f"{'':<12}{'script (AppTest)':^30}{'in Chromium':^30}",
                 f"{'page':<12}" + f"{'cold s':>10}{'cold max s':>11}{'warm s':>9}" * 2]
        for page, r in results.items():
            worst = max(r["cold_max_s"], r.get("browser_cold_max_s", 0.0))
            browser_cols = (f"{r['browser_cold_s']:>10.3f}{r['browser_cold_max_s']:>11.3f}{r['browser_warm_s']:>9.3f}"
                            if "browser_cold_s" in r else f"{'-':>10}{'-':>11}{'-':>9}")
            lines.append(f"{page:<12}{r['cold_s']:>10.3f}{r['cold_max_s']:>11.3f}{r['warm_s']:>9.3f}{browser_cols}"
                         + ("" if worst < BUDGET_S else "  OVER BUDGET"))
        print("\n".join(lines))
        publish(args, "dashboard", f"**{title}**", "```\n" + "\n".join(lines) + "\n```")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"records": n, "pages": results}, indent=2) + "\n")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
