"""`control.sh report`: a demo run on real workers (one sampling the time series every second),
its report rendered by headless Chromium, whose numbers are the run's: pages, items, errors,
over time too. The screenshot stays in the test's tmp dir (report.png)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import chains
from config import ROOT
from demo.testing import DemoServer
from external_interface.browser.check import find_executable, problems
from monitor import timeseries
from utils.redis import get_redis

pytestmark = pytest.mark.integration

MISSING = problems("")
WORKER_ENV = {
    "CHAINCRAWL_PROVIDERS": "user_agent=noop,device_id=noop,sign=noop,cookie=noop",
    "CHAINCRAWL_MAX_RETRIES": "6",
    "CHAINCRAWL_MONITOR_SERIES_INTERVAL": "1",
}


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoServer]:
    # soft failures make retries (errors); slow enough answers that the run spans a few points
    with DemoServer(size="small", latency_ms=40, features=["soft_fail"], soft_fail_rate=0.1,
                    soft_fail_slow_ms=200) as server:  # fmt: skip
        yield server


@pytest.mark.skipif(bool(MISSING), reason="; ".join(MISSING) or "browser present")
def test_the_report_shows_the_runs_numbers(
    start_worker: Any, demo: DemoServer, cc_env: dict[str, str], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    start_worker(concurrency=4, queues="demo", DEMO_BASE_URL=demo.url, **WORKER_ENV)
    run = chains.run("demo_social", seeds=[{}])
    p = run.wait(timeout=240)
    tt = p.totals
    pages, errors = tt["succeeded"] + tt["failed"] + tt["retried"], tt["failed"] + tt["retried"]
    assert errors > 0 and tt["items"] > 0  # something to show in every card
    s = get_redis()
    from config import get_settings

    assert len(timeseries.read(s, timeseries.run_series_key(get_settings(), run.run_id))) >= 2
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "cli", "report", run.run_id, "--out", str(out)],
                          cwd=ROOT, env=cc_env | {"PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{pages} pages, {tt['items']} items, {errors} errors" in done.stderr
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=find_executable(""), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("request", lambda r: requests.append(r.url))
        page.goto(out.as_uri())
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        shown = {m: page.inner_text(f'[data-metric="{m}"]').replace(",", "")
                 for m in ("runs", "pages", "items", "errors", "failed", "retried")}  # fmt: skip
        data = orjson.loads(page.inner_text("#report-data"))
        polylines = page.locator("svg polyline").count()
        browser.close()
    assert requests == [out.as_uri()]  # self-contained: nothing else was asked for
    assert shown == {"runs": "1", "pages": str(pages), "items": str(tt["items"]),
                     "errors": str(errors), "failed": str(tt["failed"]),
                     "retried": str(tt["retried"])}  # fmt: skip
    # over time: the points add up to the run's totals, spread over more than one interval
    line = data["timeline"]
    assert sum(x["pages"] for x in line) == pages and sum(x["items"] for x in line) == tt["items"]
    assert sum(x["errors"] for x in line) == errors and len(line) >= 2
    assert polylines >= 3
    # errors by type and endpoint: the retries of the soft failures, on the demo's endpoints
    retried = sum(e["n"] for e in data["errors"]
                  if e["outcome"] == "retried" and e["task"].startswith("demo."))  # fmt: skip
    assert retried >= tt["retried"]  # the window, or the totals since the counters began
    assert "demo" in {r["site"] for r in data["latency"]}  # (other tests' sites too, in a suite)
    assert (tmp_path / "report.png").stat().st_size > 10_000
