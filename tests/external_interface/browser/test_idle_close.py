"""An idle browser goes away: after `idle_close` seconds without a render the pool stops its
driver, and with it Playwright's Node.js server and Chromium; the next render starts them
again. A render in flight is never cut, however long it runs. Also on a real Celery worker."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from external_interface.browser import BrowserPool, RenderRequest, Wait
from tests.conditions import wait_for
from tests.external_interface import browser_celery as tasks
from tests.external_interface.browser_fixtures import needs_browser
from tests.external_interface.jssite import JsSite
from tests.procs import LoggedProc

pytestmark = [needs_browser, pytest.mark.integration]


@pytest.fixture(scope="module")
def site() -> Iterator[JsSite]:
    with JsSite() as s:
        yield s


def tree(pid: int) -> list[int]:
    """`pid` and every process below it (the driver, Node.js, Chromium and its helpers)."""
    p = psutil.Process(pid)
    return [pid, *(c.pid for c in p.children(recursive=True))]


def all_gone(pids: list[int], within: float = 60.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]  # fmt: skip
        if not alive:
            return True
        time.sleep(0.2)
    return False


def render_static(pool: BrowserPool, site: JsSite) -> str | None:
    return (
        pool.render(RenderRequest(site.url("/static"), wait_for="h1"))
        .response.css("h1::text")
        .get()
    )


def test_an_idle_browser_is_closed_and_the_next_render_reopens_it(
    make_browser: Callable[..., BrowserPool], site: JsSite
) -> None:
    pool = make_browser(idle_close=2.0)
    assert render_static(pool, site) == "static"
    driver, folder = pool.driver_pid, pool.driver_dir
    assert driver and folder
    procs = tree(driver)
    browser = pool.stats()["browser_pid"]
    assert browser in procs and len(procs) >= 4  # driver, Node.js, Chromium and its helpers
    assert all_gone(procs), [p for p in procs if psutil.pid_exists(p)]
    # The watcher removes the driver's folder after its processes are gone: wait for it too.
    wait_for(lambda: pool.idle_closes == 1 and not folder.exists(), 60, "the idle close done")
    assert pool.driver_pid is None
    assert render_static(pool, site) == "static"
    assert pool.driver_starts == 2 and pool.driver_pid not in (None, driver)


def test_a_render_longer_than_the_idle_time_is_not_cut(
    make_browser: Callable[..., BrowserPool], site: JsSite
) -> None:
    pool = make_browser(idle_close=1.0)
    res = pool.render(RenderRequest(site.url("/static"), actions=[Wait(4000)], timeout=30))
    assert res.response.status == 200 and pool.driver_starts == 1 and pool.idle_closes == 0


def test_without_idle_close_the_browser_stays(
    make_browser: Callable[..., BrowserPool], site: JsSite
) -> None:
    pool = make_browser(idle_close=0)
    assert render_static(pool, site) == "static"
    driver = pool.driver_pid
    time.sleep(3)
    assert pool.driver_pid == driver and driver and psutil.pid_exists(driver)


def test_a_celery_worker_closes_its_idle_browser_and_renders_again(
    site: JsSite, redis_url: str, tmp_path: Path
) -> None:
    queue = f"browser-idle-{uuid.uuid4().hex[:8]}"
    tasks.app.conf.update(broker_url=redis_url, result_backend=redis_url, task_default_queue=queue)
    env = {
        "BROWSER_TEST_REDIS_URL": redis_url,
        "BROWSER_TEST_QUEUE": queue,
        "CHAINCRAWL_BROWSER_CONTEXTS": "1",
        "CHAINCRAWL_BROWSER_IDLE_CLOSE": "3",
        "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
    }
    worker = LoggedProc(
        [sys.executable, "-m", "celery", "-A", "tests.external_interface.browser_celery",
         "worker", "-P", "threads", "-c", "2", "-Q", queue, "-n", f"{queue}@%h",
         "--without-gossip", "--without-mingle", "-l", "INFO"],
        env,
        tmp_path / "worker.log",
    )  # fmt: skip
    try:
        worker.wait_ready(60)
        assert tasks.title.delay(site.url("/static")).get(timeout=120) == "static"
        first = tasks.driver.delay().get(timeout=30)
        procs = tree(first["pid"])
        assert first["stats"]["browser_pid"] in procs
        assert all_gone(procs)  # the worker lives on; its browser does not
        assert tasks.title.delay(site.url("/static")).get(timeout=120) == "static"
        second = tasks.driver.delay().get(timeout=30)
        assert second["pid"] not in (None, first["pid"])
        assert "Traceback" not in worker.text()
    finally:
        worker.stop(timeout=30)
