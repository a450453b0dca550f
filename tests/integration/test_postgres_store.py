"""The postgres sink end to end: the demo chain on real workers stores every item once in a
PostgreSQL of the test's own, a server stopped mid-run loses nothing (the items wait in the
outbox and are stored once it is back), and history and search return what was stored."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import chains
from demo.testing import DemoServer
from external_interface.storage.outbox import backlog
from external_interface.storage.sinks.base import Policies
from tests.external_interface.postgres_fixtures import private_server
from utils.pgserver import PostgresServer
from utils.redis import get_redis

pytestmark = pytest.mark.integration

WORKER_ENV = {
    "CHAINCRAWL_PROVIDERS": "user_agent=noop,device_id=noop,sign=noop,cookie=noop",
    "CHAINCRAWL_SINKS": "jsonl,postgres",
    "CHAINCRAWL_POSTGRES_TIMEOUT": "1",
    "CHAINCRAWL_OUTBOX_MAX_BACKOFF": "1",
}


@pytest.fixture
def pg() -> Iterator[PostgresServer]:
    with private_server() as server:  # its own: the test stops and starts it
        yield server


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoServer]:
    # slow enough answers that the run is still storing when the server is stopped
    with DemoServer(size="small", latency_ms=60) as server:
        yield server


def wait_for(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_demo_chain_is_stored_once_across_a_postgres_outage(
    start_worker: Any, demo: DemoServer, pg: PostgresServer, cc_env: dict[str, str]
) -> None:
    from external_interface.storage.sinks.postgres import PostgresSink

    start_worker(concurrency=4, queues="demo", DEMO_BASE_URL=demo.url,
                 CHAINCRAWL_POSTGRES_URL=pg.url, **WORKER_ENV)  # fmt: skip
    exp = demo.expected()
    total = exp["users"] + exp["posts"] + exp["comments"]
    run = chains.run("demo_social", seeds=[{}])
    wait_for(lambda: run.progress().totals.get("stored", 0) > 0, 120, "the first items stored")
    pg.stop()  # the server goes away mid-run
    stored_at_stop = run.progress().totals.get("stored", 0)
    assert stored_at_stop < total, "the run was stored before the outage: nothing was tested"
    r = get_redis()
    wait_for(lambda: "postgres" in backlog(r, cc_env["CHAINCRAWL_KEY_PREFIX"])["errors"], 60,
             "the drainer to meet the outage")  # fmt: skip
    time.sleep(2)
    assert run.progress().totals.get("stored", 0) < total  # nothing is stored while it is down
    pg.start()
    p = run.wait(timeout=240)
    assert p.complete and p.totals["failed"] == 0 and p.totals["store_failed"] == 0
    assert p.totals["stored"] == p.totals["items"] == total
    policies = Policies()
    sink = PostgresSink(pg.url, policies=policies)
    try:
        # every item once, each row written by this run
        assert sink.count("demo.user") == sink.count("demo.user", run=run.run_id) == exp["users"]
        assert sink.count("demo.post", run=run.run_id) == exp["posts"]
        assert sink.count("demo.comment", run=run.run_id) == exp["comments"]
        with sink._conn() as conn:
            (title, likes), = conn.execute(
                "SELECT doc->>'title', (doc->>'likes')::int FROM items_demo_post "
                "WHERE post_id = 'p1'").fetchall()  # fmt: skip
        # search over the declared fields finds the post by a word of its title
        word = max(title.split(), key=len)
        assert "p1" in [d["post_id"] for d in sink.search("demo.post", word, limit=500)]
        # history: one version of each declared field, still current, with the stored value
        versions = [v for v in sink.history("demo.post", ["p1"]) if v.field == "likes"]
        assert [(v.value, v.valid_to) for v in versions] == [(likes, None)]
    finally:
        sink.close()
