"""A run whose tasks are done while its items still wait in the outbox is `storing` in every
view, and `done` only once the last item is stored."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import chains
from chains import Chain, step
from ledger.state import RunState
from monitor import status as ms
from utils.redis import get_redis

pytestmark = pytest.mark.integration

SINK_DOWN = {
    "CHAINCRAWL_SINKS": "http",
    "CHAINCRAWL_HTTP_SINK_URL": "http://127.0.0.1:9/items",  # nothing listens: every write fails
    "CHAINCRAWL_HTTP_SINK_RETRIES": "1",
    "CHAINCRAWL_HTTP_SINK_TIMEOUT": "1",
}


def listing() -> Chain:
    return Chain("testsite_listing_only", step("testsite.local.listing", options={"max_pages": 1}))


def wait_for(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_run_is_storing_until_its_items_are_stored_then_done(start_worker) -> None:
    w = start_worker(name="nosink", **SINK_DOWN)
    run = chains.run(listing(), seeds=[{}])
    r = get_redis()
    p = wait_for(lambda: (q := run.progress()).outstanding == 0 and q.totals["items"] and q,
                 timeout=30, what="the run's tasks done")  # fmt: skip
    assert p.totals["stored"] == 0 < p.totals["items"], p.totals
    # every view: the handle, `runs`, `status` (active and storing runs), the exporter's gauge
    assert p.status == "storing" and not p.complete and not p.ended
    assert RunState(r).status(run.run_id) == "storing"
    assert ms.recent_runs(r, limit=5, status="storing")[0]["run_id"] == run.run_id
    assert run.run_id in {rec["run_id"] for rec in ms.run_records(r)}
    assert [a["status"] for a in ms.active_runs(r) if a["run_id"] == run.run_id] == ["storing"]
    with pytest.raises(TimeoutError, match="items stored"):
        run.wait(timeout=1)
    # the sink-less worker goes; one with a working sink claims its entries and stores them
    w.stop()
    start_worker(name="sink")
    p = run.wait(timeout=60)
    assert p.status == "done" and p.complete, p.as_dict()
    assert p.totals["stored"] == p.totals["items"]
    assert run.run_id not in {rec["run_id"] for rec in ms.run_records(r)}  # no longer shown
    assert not r.sismember(RunState(r).storing_key, run.run_id)
