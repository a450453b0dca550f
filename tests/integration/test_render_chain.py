"""Chains with rendered steps on real workers (gevent) against the demo's JavaScript front end.

`demo_js` renders the "load more" list in a browser and crawls the rest with plain requests;
`demo_js_render` renders every list page and every post. Each run must store exactly the
site's users, posts and comments, once each: with the demo answering some requests with a
5xx, with the browser (then its driver) killed in the middle of the run, and with renders
capped per site across two workers.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import chains
from config import get_settings
from demo.testing import DemoServer
from external_interface.browser import procmem
from external_interface.storage.sinks.jsonl import iter_records
from monitor.metrics import read, task_key
from tests.external_interface.browser_fixtures import needs_browser
from utils.keyspace import Keyspace
from utils.redis import get_redis

pytestmark = [needs_browser, pytest.mark.integration, pytest.mark.timeout(420)]

# small list pages and batches, so a small demo (20 users) has several of each
PAGED: dict[str, Any] = dict(js_feed_page_size=7, js_batch_size=3, h5_statuses_page_size=2,
                             pc_comments_page_size=2)  # fmt: skip
WORKER_ENV = {
    "CHAINCRAWL_PROVIDERS": "user_agent=noop,device_id=noop,sign=noop,cookie=noop",
    "CHAINCRAWL_MAX_RETRIES": "6",
    "CHAINCRAWL_BROWSER_CONTEXTS": "2",
    "CHAINCRAWL_BROWSER_QUEUE_WAIT": "30",  # 8 task slots on 2 contexts: let them queue
    # renders queued behind others outlast the suite's 6 s visibility timeout on a busy
    # machine; a second delivery would be harmless but costs a render
    "CHAINCRAWL_VISIBILITY_TIMEOUT": "60",
}


def stored_keys(run_id: str, item_type: str, key: str) -> list[str]:
    """Keys of the items this run wrote to the JSONL sink (one line per stored item)."""
    return [r["item"][key] for r in iter_records(item_type) if r["run"] == run_id]


def check_stored(p: chains.runner.Progress, users: int, posts: int, comments: int) -> None:
    """Complete, nothing failed, and every user, post and comment stored exactly once."""
    assert p.complete and p.outstanding == 0
    assert p.totals["failed"] == 0
    assert p.totals["stored"] == p.totals["items"] == users + posts + comments
    for item_type, key, prefix, n in (("demo.user", "user_id", "u", users),
                                      ("demo.post", "post_id", "p", posts),
                                      ("demo.comment", "comment_id", "c", comments)):  # fmt: skip
        got = Counter(stored_keys(p.run_id, item_type, key))
        assert [k for k, c in got.items() if c > 1] == []  # no duplicates
        assert sorted(got) == sorted(f"{prefix}{i}" for i in range(1, n + 1))  # none missing


def metrics(task: str) -> dict[str, int]:
    return read(get_redis(), task_key(task, get_settings()))


@pytest.fixture(scope="module")
def flaky_demo() -> Iterator[DemoServer]:
    """5 % of answers are a 5xx: the page, its script, or the API the script reads."""
    with DemoServer(size="small", **PAGED, features=["soft_fail"], soft_fail_rate=0.05,
                    soft_fail_kinds=["error"]) as server:  # fmt: skip
        yield server


def test_a_rendered_list_feeds_plain_steps_with_exact_counts(
    start_worker: Any, flaky_demo: DemoServer
) -> None:
    flaky_demo.reset()
    start_worker(concurrency=8, queues="demo", DEMO_BASE_URL=flaky_demo.url, **WORKER_ENV)
    exp = flaky_demo.expected()
    p = chains.run("demo_js", seeds=[{}]).wait(timeout=300)
    s = p.steps
    assert s["js.more"]["succeeded"] == 1 and s["js.more"]["items"] == 0  # entries feed children
    assert s["h5.user_info"]["succeeded"] == s["h5.user_info"]["items"] == exp["users"] == 20
    assert s["h5.user_statuses"]["succeeded"] == exp["h5"]["status_pages"]
    assert s["app.detail"]["succeeded"] == s["app.detail"]["items"] == exp["posts"]
    assert s["pc.comment"]["items"] == exp["comments"]
    check_stored(p, exp["users"], exp["posts"], exp["comments"])
    # the list was rendered: the browser clicked "load more" until every batch was in
    by_endpoint = flaky_demo.stats()["by_endpoint"]
    assert by_endpoint["js.more"] >= 1
    assert by_endpoint["js.api.feed"] >= exp["js"]["batches"] == 7
    assert metrics("demo.js.more")["renders"] >= 1


def browsers_of(pid: int) -> list[int]:
    return procmem.browser_pids(pid)


def drivers_of(pid: int) -> list[int]:
    return [p for p in procmem.descendants(pid)
            if "external_interface.browser.driver" in " ".join(procmem.cmdline(p))]  # fmt: skip


def test_a_browser_and_a_driver_killed_mid_run_cost_retries_never_items(start_worker: Any) -> None:
    # 10 users x 4 posts: 2 rendered list pages and 40 rendered posts; 150 ms per answer, so
    # renders are in flight whenever the kill comes
    with DemoServer(users=10, posts_per_user=4, comments_per_post=2, latency_ms=150,
                    **PAGED) as demo:  # fmt: skip
        w = start_worker(concurrency=8, queues="demo", DEMO_BASE_URL=demo.url, **WORKER_ENV)
        worker_pid = w.proc.pid
        run = chains.run("demo_js_render", seeds=[{}])

        def details_done(n: int) -> None:
            deadline = time.monotonic() + 180
            while run.progress().steps["js.detail"]["succeeded"] < n:
                assert time.monotonic() < deadline, run.progress()
                time.sleep(0.05)

        details_done(8)
        (browser,) = browsers_of(worker_pid)
        os.kill(browser, signal.SIGKILL)
        details_done(20)
        (driver,) = drivers_of(worker_pid)
        assert browser not in browsers_of(worker_pid)  # a new browser took over
        os.kill(driver, signal.SIGKILL)
        p = run.wait(timeout=240)
        check_stored(p, 10, 40, 80)
        assert p.steps["js.detail"]["succeeded"] == p.steps["js.detail"]["items"] == 40
        assert w.proc.poll() is None  # the worker never went down
        assert drivers_of(worker_pid) and driver not in drivers_of(worker_pid)
        crashed = metrics("demo.js.detail").get("retried:BrowserCrashed", 0)
        crashed += metrics("demo.js.feed").get("retried:BrowserCrashed", 0)
        print(f"retries after the kills: {crashed} BrowserCrashed; run took {p.elapsed:.1f}s")
        assert crashed >= 1, "the kills hit renders in flight"


def test_renders_are_capped_per_site_across_workers(start_worker: Any) -> None:
    with DemoServer(size="tiny", latency_ms=100, **PAGED) as demo:
        env = {**WORKER_ENV, "CHAINCRAWL_BROWSER_SITE_LIMIT": "1", "DEMO_BASE_URL": demo.url}
        for _ in range(2):
            start_worker(concurrency=4, queues="demo", **env)
        run = chains.run("demo_js_render", seeds=[{}])
        leases = Keyspace(get_settings().key_prefix).limit("demo.render", "leases")
        r = get_redis()
        seen: Counter[int] = Counter()
        while not run.progress().ended:
            seen[r.zcard(leases)] += 1
            time.sleep(0.01)
        p = run.progress()
        check_stored(p, 5, 15, 60)
        assert max(seen) == 1 and seen[1] > 0  # one render at a time, for both workers
        waited = sum(
            metrics(t).get("waited:Throttled", 0) for t in ("demo.js.feed", "demo.js.detail")
        )
        print(f"leases in flight sampled: {dict(seen)}; {waited} renders waited for a place")
        assert waited > 0  # the other renders were held back, not failed
