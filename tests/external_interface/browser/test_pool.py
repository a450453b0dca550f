"""The browser pool under trouble: killed browsers and drivers, a wedged driver, a full pool,
recycling by pages and by memory, many threads, and real Celery workers on gevent and threads."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from demo.testing import DemoServer
from exceptions import BrowserCrashed, Policy, RenderTimeout, ResourceUnavailable, policy_for
from external_interface.browser import BrowserPool, LoadMore, RenderRequest, procmem
from tests.external_interface import browser_celery as tasks
from tests.external_interface.browser_fixtures import needs_browser
from tests.procs import LoggedProc

pytestmark = [needs_browser, pytest.mark.integration]


def post(demo: DemoServer, pid: str = "p1") -> RenderRequest:
    return RenderRequest(demo.url_for(f"/js/post/{pid}"), wait_for="article[data-state=ready]")


def rendered_pid(pool: BrowserPool, demo: DemoServer, pid: str = "p1") -> str | None:
    return pool.render(post(demo, pid)).response.css("article::attr(data-pid)").get()


def in_background(fn: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or "zombie" in _state(pid):
            return True
        time.sleep(0.05)
    return False


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


def test_a_browser_killed_mid_render_is_a_retry_and_the_next_render_gets_a_new_one(
    make_browser: Callable[..., BrowserPool], js_demo: DemoServer
) -> None:
    pool = make_browser()
    assert rendered_pid(pool, js_demo) == "p1"
    before = pool.stats()
    t, out = in_background(
        lambda: pool.render(RenderRequest(js_demo.url_for("/js/hang"), timeout=20))
    )
    time.sleep(1.0)
    os.kill(before["browser_pid"], signal.SIGKILL)
    t.join(30)
    exc = out["error"]
    assert isinstance(exc, BrowserCrashed) and policy_for(exc) is Policy.RETRY, exc
    assert rendered_pid(pool, js_demo, "p2") == "p2"
    after = pool.stats()
    assert after["generation"] == before["generation"] + 1 and after["crashes"] == 1
    assert after["browser_pid"] != before["browser_pid"] and after["pid"] == before["pid"]
    assert gone(before["browser_pid"])


def test_a_driver_killed_mid_render_is_a_retry_and_a_new_driver_takes_over(
    make_browser: Callable[..., BrowserPool], js_demo: DemoServer
) -> None:
    pool = make_browser()
    assert rendered_pid(pool, js_demo) == "p1"
    old_driver, old_dir, old_browser = pool.driver_pid, pool.driver_dir, pool.stats()["browser_pid"]
    assert old_driver and old_dir
    t, out = in_background(
        lambda: pool.render(RenderRequest(js_demo.url_for("/js/hang"), timeout=20))
    )
    time.sleep(1.0)
    os.kill(old_driver, signal.SIGKILL)
    t.join(30)
    assert isinstance(out["error"], BrowserCrashed), out
    assert rendered_pid(pool, js_demo, "p3") == "p3"
    assert pool.driver_starts == 2 and pool.driver_pid != old_driver
    assert gone(old_browser)  # the dead driver's Chromium does not linger
    assert procmem.pids_with_arg(str(old_dir)) == [] and not old_dir.exists()


def test_a_driver_that_stops_answering_is_replaced(
    make_browser: Callable[..., BrowserPool], js_demo: DemoServer
) -> None:
    pool = make_browser(answer_grace=2.0)
    assert rendered_pid(pool, js_demo) == "p1"
    wedged = pool.driver_pid
    assert wedged
    os.kill(wedged, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(RenderTimeout, match="did not answer"):
            pool.render(RenderRequest(js_demo.url_for("/js/post/p1"), timeout=1.0))
        assert time.monotonic() - t0 < 1.0 + 2.0 + 2.0
    finally:
        procmem.kill([wedged], signal.SIGCONT)  # if the pool had not killed it
    assert rendered_pid(pool, js_demo, "p4") == "p4" and pool.driver_pid != wedged


def test_a_full_pool_re_queues_instead_of_waiting_out_the_deadline(
    make_browser: Callable[..., BrowserPool], js_demo: DemoServer
) -> None:
    pool = make_browser(contexts=1, queue_wait=0.5)
    assert rendered_pid(pool, js_demo) == "p1"
    t, out = in_background(
        lambda: pool.render(RenderRequest(js_demo.url_for("/js/hang"), timeout=4))
    )
    time.sleep(1.0)
    t0 = time.monotonic()
    with pytest.raises(ResourceUnavailable) as err:
        pool.render(post(js_demo))
    assert 0.4 < time.monotonic() - t0 < 2.0 and policy_for(err.value) is Policy.WAIT
    with pytest.raises(RenderTimeout, match="no browser context free before the deadline"):
        pool.render(RenderRequest(js_demo.url_for("/js/post/p1"), timeout=0.3))
    t.join(20)
    assert isinstance(out["error"], RenderTimeout)
    assert rendered_pid(pool, js_demo, "p5") == "p5"


def test_contexts_are_recycled_after_n_pages(
    make_browser: Callable[..., BrowserPool], js_demo: DemoServer
) -> None:
    pool = make_browser(context_pages=3)
    for i in range(7):
        assert rendered_pid(pool, js_demo, f"p{i + 1}") == f"p{i + 1}"
    st = pool.stats()
    assert st["contexts_created"] == 3 and st["contexts_recycled"] == 2 and st["launches"] == 1


def test_the_browser_is_restarted_above_its_memory_ceiling(
    make_browser: Callable[..., BrowserPool], js_demo: DemoServer
) -> None:
    pool = make_browser(memory_mb=1)  # any browser is above 1 MB: a restart after each check
    for i in range(3):
        assert rendered_pid(pool, js_demo, f"p{i + 1}") == f"p{i + 1}"
        time.sleep(1.1)  # memory is checked at most once a second
    st = pool.stats()
    assert (
        st["recycles"] >= 2 and st["launches"] == st["recycles"] + 1 and st.get("crashes", 0) == 0
    )
    assert st["memory_mb"] > 50  # what was measured: the whole process tree, not its wrapper


def test_many_threads_share_a_bounded_pool(
    make_browser: Callable[..., BrowserPool], js_demo: DemoServer
) -> None:
    pool = make_browser(contexts=2)
    req = RenderRequest(
        js_demo.url_for("/js/more"),
        wait_for=".feed-item",
        actions=[LoadMore("button.load-more", item=".feed-item")],
    )
    with ThreadPoolExecutor(6) as ex:
        counts = list(ex.map(lambda _: len(pool.render(req).response.css(".feed-item")), range(12)))
    assert counts == [20] * 12
    st = pool.stats()
    assert st["contexts_open"] <= 2 and st["renders"] == 12 and pool.driver_starts == 1


@pytest.mark.parametrize("worker_pool", ["gevent", "threads"])
def test_celery_workers_render_on_gevent_and_threads(
    worker_pool: str, js_demo: DemoServer, redis_url: str, tmp_path: Path
) -> None:
    queue = f"browser-{uuid.uuid4().hex[:8]}"
    tasks.app.conf.update(broker_url=redis_url, result_backend=redis_url, task_default_queue=queue)
    env = {
        "BROWSER_TEST_REDIS_URL": redis_url,
        "BROWSER_TEST_QUEUE": queue,
        "CHAINCRAWL_BROWSER_CONTEXTS": "2",
        "CHAINCRAWL_BROWSER_QUEUE_WAIT": "120",  # 7 renders on 2 contexts: let them queue
        "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
    }
    worker = LoggedProc(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.external_interface.browser_celery",
            "worker",
            "-P",
            worker_pool,
            "-c",
            "6",
            "-Q",
            queue,
            "-n",
            f"{queue}@%h",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "INFO",
        ],
        env,
        tmp_path / "worker.log",
    )
    try:
        worker.wait_ready(60)
        more = js_demo.url_for("/js/more")
        results = [tasks.load_all.delay(more) for _ in range(6)]
        for r in results:
            assert len(r.get(timeout=180)["pids"]) == 20
        # after the loads: a render's deadline includes waiting for a context, so sent among
        # them, the hung page could spend its 3 s queued and time out with no page to capture
        stuck = tasks.hang.delay(js_demo.url_for("/js/hang"), 3.0)
        hung = stuck.get(timeout=60)
        assert hung["error"] == "RenderTimeout" and hung["screenshot"] and hung["seconds"] < 3 + 8
        info = tasks.driver.delay().get(timeout=30)
        assert info["stats"]["renders"] == 7 and info["stats"]["contexts_open"] <= 2
        assert "Traceback" not in worker.text()
    finally:
        worker.stop(timeout=30)
    assert gone(info["pid"]) and gone(info["stats"]["browser_pid"])
    assert procmem.pids_with_arg(info["dir"]) == []
