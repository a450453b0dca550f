"""The item store (MongoDB, here nx-27017 speaking its wire protocol) down in the middle of a
demo crawl: nothing lost, the backlog visible meanwhile, and it drains once the store is back.

Items go to two sinks, `jsonl,mongo`. The Mongo server is stopped for a while (short: 10 s,
long: 30 s) and started again on the same port and data dir. Meanwhile the crawl goes on:
tasks commit their items to the outbox stream, the drainers fail on Mongo (JSONL works: its
write is repeated on retry and skipped as already committed), keep their batches pending
and retry with backoff. `control.sh status` (monitor.snapshot.snapshot) shows the backlog
growing and the failing sink's error. After the restart every item is in Mongo exactly once
(unique index on the key) and in the JSONL files exactly once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import pymongo
import pytest

import chains
from config import get_settings
from demo.testing import DemoServer
from monitor.snapshot import snapshot
from tests.external_interface.mongo_server import MongoServer
from tests.torture.conftest import report, sizes
from tests.torture.harness import (
    Resender,
    SentLedger,
    check_store,
    counters,
    demo_expected_ids,
    raise_broken_guarantees,
    wait_complete,
    wait_for,
)
from tests.torture.test_kill_workers import social_pages
from utils.redis import get_redis

DB = "torture"


@dataclass
class Size:
    users: int
    outage: float
    timeout: float


SHORT = Size(users=60, outage=10.0, timeout=300)  # 723 pages, 1,860 items
LONG = Size(users=400, outage=30.0, timeout=1800)  # 4,820 pages, 12,400 items


class BacklogWatch(threading.Thread):
    """Samples what `control.sh status` shows about storage, every half second."""

    def __init__(self) -> None:
        super().__init__(name="backlog-watch", daemon=True)
        self.samples: list[dict[str, Any]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            try:
                ob = snapshot(get_settings(), workers_timeout=None)["outbox"]
            except Exception:  # the watch must not die; a missed sample is fine
                continue
            self.samples.append({"t": time.monotonic(), **ob})

    def stop(self) -> None:
        self.stop_event.set()
        self.join(5)


@pytest.mark.parametrize("size", sizes(SHORT, LONG))
def test_store_down_mid_crawl_loses_nothing(
    size: Size,
    torture_factory: Any,
    fleets: Any,
    tmp_path: Any,
    request: pytest.FixtureRequest,
) -> None:
    mongo = MongoServer(tmp_path / "nx").start()
    try:
        with DemoServer(
            users=size.users, posts_per_user=5, comments_per_post=5, latency_ms=30,
            latency_jitter_ms=30,
        ) as demo:  # fmt: skip
            t = torture_factory(
                DEMO_BASE_URL=demo.url,
                CHAINCRAWL_SINKS="jsonl,mongo",
                CHAINCRAWL_MONGO_URL=mongo.url,
                CHAINCRAWL_MONGO_DB=DB,
                CHAINCRAWL_MONGO_TIMEOUT="2",
            )
            _crawl_through_outage(size, t, fleets, mongo, demo, request)
    finally:
        mongo.stop()


def _crawl_through_outage(
    size: Size, t: Any, fleets: Any, mongo: MongoServer, demo: DemoServer, request: Any
) -> None:
    fleet = fleets(t, queues="demo", concurrency=8)
    workers = fleet.start(2)
    exp = demo.expected()
    pages = social_pages(exp)
    items = exp["users"] + exp["posts"] + exp["comments"]
    ledger = SentLedger(t.env["CHAINCRAWL_REDIS_URL"], t.prefix).start()
    resender = Resender(ledger, t.prefix)
    watch = BacklogWatch()
    run = chains.run("demo_social", seeds=[{}])
    r = get_redis()
    try:
        wait_for(
            lambda: counters(r, t.prefix, run.run_id).get("stored", 0) >= 0.2 * items,
            timeout=size.timeout,
            what="a fifth of the items stored",
        )
        watch.start()
        mongo.stop()
        down_at = time.monotonic()
        stored_at_stop = counters(r, t.prefix, run.run_id)["stored"]
        time.sleep(size.outage)
        during = [s for s in watch.samples if s["t"] >= down_at + 3]  # after the first failures
        stored_at_restart = counters(r, t.prefix, run.run_id)["stored"]
        mongo.start()
        p = wait_complete(
            run, timeout=size.timeout, on_poll=resender, progress_log=t.logs / "progress.log"
        )
    finally:
        watch.stop()
        ledger.stop()

    store = check_store(t.items, demo_expected_ids(exp), run.run_id)
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
        mongo.url, serverSelectionTimeoutMS=5000
    )
    try:
        in_mongo = {}
        for item_type, (key, ids) in demo_expected_ids(exp).items():
            coll = client[DB][item_type.replace(".", "_")]
            keys = [d[key] for d in coll.find({}, {key: 1})]
            in_mongo[item_type] = {
                "docs": len(keys),
                "unique": len(set(keys)),
                "missing": len(ids - set(keys)),
            }
    finally:
        client.close()
    peak = max((s["length"] for s in during), default=0)
    figures = {
        "outage_s": size.outage,
        "pages": pages,
        "items_expected": items,
        "stored_counter_at_stop": stored_at_stop,
        "stored_counter_at_restart": stored_at_restart,
        "backlog_peak": peak,
        "backlog_samples_during_outage": len(during),
        "sink_errors_seen": sorted({k for s in during for k in s.get("errors", {})}),
        "mongo": in_mongo,
        "messages_lost_by_broker": resender.losses,
        **store.summary(),
        "counters": p.totals,
        "elapsed_s": round(p.elapsed, 1),
    }
    figures.pop("by_type")
    report(request.node.name, **figures)

    assert all(w.alive() for w in workers)
    # the outage was visible: the backlog grew and the failing sink was named
    assert during and peak > 0
    assert any("mongo" in s.get("errors", {}) for s in during), during[-1:]
    # while the store was down nothing counted as stored (a few in-flight batches may land)
    assert stored_at_restart - stored_at_stop < 0.05 * items
    # ... and after it came back: everything, once
    assert p.complete and p.totals["failed"] == 0, p.totals
    assert p.totals["dispatched"] == p.totals["succeeded"] == pages, p.totals
    assert p.totals["stored"] == p.totals["items"] == items, p.totals
    for item_type, m in in_mongo.items():
        assert m["docs"] == m["unique"] and m["missing"] == 0, (item_type, m)
    assert sum(m["docs"] for m in in_mongo.values()) == items
    assert store.missing == 0 and store.items_checked == items and store.dup_keys == 0
    backlog_after = snapshot(get_settings(), workers_timeout=None)["outbox"]
    assert backlog_after["length"] == 0 and not backlog_after["errors"], backlog_after
    raise_broken_guarantees(resender, store)
