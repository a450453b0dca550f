"""Calibration: the same crawl as plain Celery tasks, with none of chaincrawl's machinery.

    .venv/bin/python -m bench.plain_celery                 # 1 page per task, then 20 per task
    .venv/bin/python -m bench.plain_celery --batch 1 --pages 1500

What a Celery crawler minimally does per page: take a message, fetch (requests), parse
(`bench.workload.parse`), hand the item off and check the links against a seen-set in one Redis
pipeline (RPUSH items, SADD per link, INCRBY pages), publish one `apply_async` per new link
(or one per `--batch` links). Celery as configured out of the box for a Redis broker (threads
pool, acks late, prefetch 1, no task events), worker log level INFO. It is the floor the
chaincrawl mechanism (typed schemas, exactly-once commits, counters, metrics, dead letters,
outbox) is built on, measured in the same run, and `--batch 20` shows what N pages per message
buys on top of Celery.

This module is also the Celery app of those workers (`celery -A bench.plain_celery worker`);
it reads `PLAIN_REDIS_URL` and `PLAIN_BATCH`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
import redis
import requests
from celery import Celery
from parsel import Selector

from bench.workload import RULES, parse

QUEUE = "plain"
app = Celery("plain")
app.conf.update(
    broker_url=os.environ.get("PLAIN_REDIS_URL", "redis://127.0.0.1:1/0"),
    task_ignore_result=True,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
)
BATCH = int(os.environ.get("PLAIN_BATCH", "1"))
_local = threading.local()
_r: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _r
    if _r is None:
        _r = redis.Redis.from_url(app.conf.broker_url)
    return _r


def _session() -> requests.Session:
    s = getattr(_local, "s", None)
    if s is None:
        s = _local.s = requests.Session()
        s.trust_env = False
    return s


def crawl_page(url: str, kind: str) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    resp = _session().get(url, timeout=20)
    resp.raise_for_status()
    fields, links, nxt = parse(kind, Selector(text=resp.text))
    kids = [(urljoin(resp.url, h), RULES[kind].link_kind or "") for h in links]
    if nxt:
        kids.append((urljoin(resp.url, nxt), kind))
    return {"url": resp.url, "kind": kind, **fields}, kids


def _finish(items: list[dict[str, Any]], kids: list[tuple[str, str]]) -> None:
    pipe = _redis().pipeline(transaction=False)
    pipe.rpush("plain:items", *[orjson.dumps(i) for i in items])
    for url, _ in kids:
        pipe.sadd("plain:seen", url)
    pipe.incrby("plain:done", len(items))
    res = pipe.execute()
    fresh = [k for k, added in zip(kids, res[1 : 1 + len(kids)], strict=True) if added]
    if BATCH <= 1:
        for url, kind in fresh:
            page.apply_async((url, kind))
    else:
        for i in range(0, len(fresh), BATCH):
            pages.apply_async(([list(k) for k in fresh[i : i + BATCH]],))


@app.task(name="plain.page")
def page(url: str, kind: str) -> None:
    item, kids = crawl_page(url, kind)
    _finish([item], kids)


@app.task(name="plain.pages")
def pages(entries: list[list[str]]) -> None:
    items, kids = [], []
    for url, kind in entries:
        item, k = crawl_page(url, kind)
        items.append(item)
        kids += k
    _finish(items, kids)


def crawl(
    bench: Any, demo: Any, batch: int, concurrency: int = 16, timeout: float = 600
) -> dict[str, Any]:
    """One measured crawl on fresh workers of this app (a ChaincrawlBench supplies Redis)."""
    from bench.chaincrawl_bench import Worker
    from bench.workload import expected_pages

    cfg = demo.config
    want = expected_pages(cfg.users, cfg.posts_per_user, cfg.comments_per_post)
    bench.stop_workers()
    bench.flush()
    url = bench.redis.url
    app.conf.update(broker_url=url)
    global _r
    _r = None
    logs = bench.workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    w = Worker(
        {"PLAIN_REDIS_URL": url, "PLAIN_BATCH": str(batch), "PYTHONPATH": bench.env["PYTHONPATH"]},
        logs / f"plain-{batch}-{int(time.time())}.log",
        "threads",
        concurrency,
        f"plain{batch}",
        app="bench.plain_celery",
        queue=QUEUE,
        events=False,
    )
    bench.workers.append(w)
    w.wait_ready()
    r = _redis()

    def run(seed_url: str, kind: str, n: int) -> float:
        r.delete("plain:done", "plain:seen", "plain:items")
        t0 = time.monotonic()
        if batch <= 1:
            page.apply_async((seed_url, kind))
        else:
            pages.apply_async(([[seed_url, kind]],))
        deadline = t0 + timeout
        while int(r.get("plain:done") or 0) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"plain celery crawl not done in {timeout}s")
            time.sleep(0.05)
        return time.monotonic() - t0

    warm = 1 + cfg.posts_per_user * 2  # one user's pages
    run(demo.url_for("/pc/user/u1"), "user", warm)
    time.sleep(0.3)
    demo.reset()
    cpu0 = w.cpu()
    wall = run(demo.url_for("/pc/feed?page=1"), "feed", want)
    cpu1 = w.cpu()
    pages_seen = int(demo.stats()["total"])
    rss = w.peak_rss_mb()
    bench.stop_workers()
    return {
        "system": f"celery plain, {batch} page(s)/task",
        "pages": pages_seen,
        "wall_s": wall,
        "cpu_s": cpu1 - cpu0,
        "pages_per_s": pages_seen / wall,
        "cpu_ms_per_page": 1000 * (cpu1 - cpu0) / pages_seen,
        "peak_rss_mb": rss,
        "expected_pages": want,
    }


def main(argv: list[str] | None = None) -> int:
    from bench.chaincrawl_bench import ChaincrawlBench
    from bench.workload import site_for_pages
    from demo.testing import DemoServer

    ap = argparse.ArgumentParser(description="plain Celery calibration crawl")
    ap.add_argument("--pages", type=int, default=1500)
    ap.add_argument("--batch", default="1,20", help="pages per task, comma-separated")
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    a = ap.parse_args(argv)
    users, posts, comments = site_for_pages(a.pages)
    with (
        DemoServer(users=users, posts_per_user=posts, comments_per_post=comments) as demo,
        ChaincrawlBench() as b,
    ):
        for batch in (int(x) for x in a.batch.split(",")):
            print(json.dumps(crawl(b, demo, batch, a.concurrency)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
