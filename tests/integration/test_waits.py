"""Tasks waiting for an empty resource pool re-queue without holding a slot, for as long as
`CHAINCRAWL_RESOURCE_WAIT_MAX` allows, however many times that takes; then they are
dead-lettered and the run completes."""

from __future__ import annotations

import time

import pytest

import chains
from chains import Chain, step
from monitor.deadletter import DeadLetterStore
from utils.redis import get_redis

pytestmark = pytest.mark.integration


def test_a_task_starved_of_resources_waits_its_time_then_is_dead_lettered(start_worker) -> None:
    start_worker(CHAINCRAWL_RESOURCE_WAIT_MAX="3", CHAINCRAWL_MAX_RETRIES="0")
    t0 = time.monotonic()
    run = chains.run(Chain("starved", step("testsite.local.starved")), seeds=[{"entry_id": "a"}])
    p = run.wait(timeout=60)
    elapsed = time.monotonic() - t0
    assert p.complete and p.totals["failed"] == 1 and p.totals["succeeded"] == 0
    (dl,) = [d for d in DeadLetterStore(get_redis()).list(50) if d.meta.get("run") == run.run_id]
    assert dl.error_type == "ResourceUnavailable"
    assert dl.meta["waits"] >= 5  # re-queued every 0.2 s for 3 s: a count cap would be wrong
    assert elapsed >= 3  # not before its time
    assert dl.retries == 0  # waiting does not use up retries
