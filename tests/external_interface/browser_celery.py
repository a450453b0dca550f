"""A Celery app whose tasks render pages, for the test that runs real workers on each pool.

`celery -A tests.external_interface.browser_celery worker -P gevent|threads`; the broker and
result backend come from `BROWSER_TEST_REDIS_URL`, the queue from `BROWSER_TEST_QUEUE`, the
pool's sizes from the usual CHAINCRAWL_BROWSER_* variables.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from external_interface.browser import LoadMore, RenderRequest, get_pool

app = Celery("browser_test")
app.conf.update(
    broker_url=os.environ.get("BROWSER_TEST_REDIS_URL", "redis://127.0.0.1:1/0"),
    result_backend=os.environ.get("BROWSER_TEST_REDIS_URL", "redis://127.0.0.1:1/0"),
    task_default_queue=os.environ.get("BROWSER_TEST_QUEUE", "browser"),
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)


@app.task
def load_all(url: str) -> dict[str, Any]:
    """Every entry of a "load more" page."""
    t0 = time.monotonic()
    res = get_pool().render(
        RenderRequest(
            url, wait_for=".feed-item", actions=[LoadMore("button.load-more", item=".feed-item")]
        )
    )
    return {
        "pids": res.response.css(".feed-item::attr(data-pid)").getall(),
        "seconds": time.monotonic() - t0,
    }


@app.task
def hang(url: str, timeout: float) -> dict[str, Any]:
    """A page that never settles: what the worker sees of it."""
    t0 = time.monotonic()
    try:
        get_pool().render(RenderRequest(url, timeout=timeout))
    except Exception as exc:
        shot = getattr(exc, "screenshot", None)
        return {
            "error": type(exc).__name__,
            "screenshot": bool(shot),
            "seconds": time.monotonic() - t0,
        }
    return {"error": None, "seconds": time.monotonic() - t0}


@app.task
def driver() -> dict[str, Any]:
    pool = get_pool()
    return {"pid": pool.driver_pid, "dir": str(pool.driver_dir), "stats": pool.stats()}


@app.task
def title(url: str) -> str | None:
    """The `<h1>` of a rendered page."""
    return get_pool().render(RenderRequest(url, wait_for="h1")).response.css("h1::text").get()
