"""A selector that matches nothing, end to end on a real worker against a site of the test's
own: the page is counted `empty` (the run's step, the endpoint's metrics and exporter) and
warned in `runs` and `status`; an endpoint declared `must_yield=True` fails it as `EmptyPage`
after its retry, and a page that came back wrong once succeeds on the retry."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest
from aiohttp import web

import chains
from chains import Chain, step
from config import ROOT
from monitor.deadletter import DeadLetterStore
from monitor.exporter import ChaincrawlCollector
from monitor.status import summary, task_metrics
from tests.threaded_site import ThreadedSite
from utils.redis import get_redis

pytestmark = pytest.mark.integration

FULL = "<html><body><ul><li class='row'>a</li><li class='row'>b</li></ul></body></html>"
# the layout changed: rows are now `li.item`, the endpoint's `li.row` matches nothing
CHANGED = "<html><body><ul><li class='item'>a</li><li class='item'>b</li></ul></body></html>"


class RowsSite(ThreadedSite):
    """`/full` two rows, `/changed` none (another layout), `/flaky` none once, then two."""

    def __init__(self) -> None:
        super().__init__()
        self.hits: dict[str, int] = {}

    def app(self) -> web.Application:
        async def page(request: web.Request) -> web.Response:
            name = request.match_info["name"]
            self.hits[name] = self.hits.get(name, 0) + 1
            body = {"full": FULL, "changed": CHANGED}.get(name)
            if name == "flaky":
                body = CHANGED if self.hits[name] == 1 else FULL
            return web.Response(text=body or "", content_type="text/html")

        app = web.Application()
        app.router.add_get("/{name}", page)
        return app


@pytest.fixture
def rows_site() -> Iterator[RowsSite]:
    site = RowsSite().start()
    try:
        yield site
    finally:
        site.stop()


def control(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / "control.sh"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})  # fmt: skip


def metrics_of(task: str, key: str) -> dict:
    deadline = time.monotonic() + 20
    while True:  # the metrics are written within a flush interval
        m = summary(task_metrics(get_redis()).get(task, {}))
        if m[key] or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def test_a_page_that_yields_nothing_is_counted_and_warned(start_worker, cc_env, rows_site) -> None:
    start_worker()
    run = chains.run(Chain("empty_rows", step("testsite.local.rows")),
                     seeds=[{"url": f"{rows_site.url}/full"}, {"url": f"{rows_site.url}/changed"}])  # fmt: skip
    p = run.wait(timeout=60)
    assert p.ok and p.totals["items"] == 2, str(p.as_dict())  # "complete: every task succeeded" ...
    assert p.steps["local.rows"]["empty"] == p.totals["empty"] == 1  # ... but one page was empty
    assert metrics_of("testsite.local.rows", "empty")["empty"] == 1
    fams = {f.name: f for f in ChaincrawlCollector(get_redis()).collect()}
    (sample,) = fams["chaincrawl_empty_pages"].samples
    assert sample.labels["task"] == "testsite.local.rows" and sample.value == 1
    out = control("runs", run.run_id)
    assert out.returncode == 0, out.stderr
    assert "warning: 1 page(s) yielded nothing (no item, no follow-up): local.rows 1" in out.stdout
    out = control("status")
    assert out.returncode == 0, out.stderr
    assert "pages that yielded nothing (no item, no follow-up): testsite.local.rows 1" in out.stdout


def test_a_must_yield_endpoint_fails_an_empty_page_after_its_retry(
    start_worker, cc_env, rows_site
) -> None:
    start_worker()
    run = chains.run(Chain("must_rows", step("testsite.local.rows_must")),
                     seeds=[{"url": f"{rows_site.url}/changed"}, {"url": f"{rows_site.url}/flaky"}])  # fmt: skip
    p = run.wait(timeout=90)
    s = p.steps["local.rows_must"]
    # /changed: tried twice (max_retries=1), then dead-lettered; /flaky: whole on its retry
    assert (s["failed"], s["retried"], s["succeeded"], s["items"]) == (1, 2, 1, 2)
    assert rows_site.hits == {"changed": 2, "flaky": 2}
    assert p.totals.get("empty", 0) == 0  # failed, not counted as an empty success
    (dl,) = DeadLetterStore(get_redis()).list(10, run=run.run_id)
    assert dl.error_type == "EmptyPage"
    assert dl.error == (f"testsite.local.rows_must: the page yielded nothing (no item, no "
                        f"follow-up; must_yield=True) from {rows_site.url}/changed: does a "
                        "selector match nothing?")  # fmt: skip
