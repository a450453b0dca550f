"""A retry that avoids every member of a resource pool must not wait for good.

A failed request puts the leases it used into the task's `avoid` list, so its retry gets other
members. When every member of the pool is in that list (a device pool at its low-water mark:
nothing is produced), `checkout` found nothing it could lend, forever: the task re-queued
itself every 0.2 s until `CHAINCRAWL_RESOURCE_WAIT_MAX` (30 min by default), its message
always held for its countdown in kombu's `unacked`, the run stalled with an idle worker. The
pool now lends the avoided member idle longest when no other member exists at all.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

import chains
from chains import Chain, step
from external_interface.resources.pool import Pool, PoolConfig

pytestmark = pytest.mark.integration


def _pool(rds: redis.Redis, prefix: str, *ids: str) -> Pool:
    pool = Pool("device_id", "shop", rds=rds, prefix=prefix, config=PoolConfig(low_water=1))
    for mid in ids:
        pool.add({"device_id": f"secret-{mid}"}, mid)
    return pool


def test_avoid_is_a_preference_that_never_empties_the_pool(
    rds: redis.Redis, key_prefix: str
) -> None:
    pool = _pool(rds, key_prefix, "d0", "d1")
    co = pool.checkout(avoid={"d0", "d1"})  # every member avoided: the one idle longest
    assert co.lease is not None and co.lease.id == "d0"
    # another member the task does not avoid exists: it is lent, not an avoided one...
    pool = _pool(rds, f"{key_prefix}b", "d0", "d1", "d2")
    co = pool.checkout(avoid={"d0", "d1"})
    assert co.lease is not None and co.lease.id == "d2"
    # ...and while it is out, the task waits for it rather than take an avoided one
    co = pool.checkout(avoid={"d0", "d1"})
    assert co.lease is None and co.available == 2
    # avoided ids that are not (or no longer) members do not count
    pool = _pool(rds, f"{key_prefix}c", "d0")
    co = pool.checkout(avoid={"d0", "gone-1", "gone-2"})
    assert co.lease is not None and co.lease.id == "d0"


def test_a_retry_that_avoids_the_only_device_still_runs(start_worker: Any) -> None:
    import tests.integration.avoid_site.devices  # noqa: F401 - the endpoint, in this process too

    pool = Pool("device_id", "testsite")
    pool.clear()
    pool.add({"device_id": "only-device"}, "only-device")
    start_worker(
        CHAINCRAWL_EXTRA_SITE_PACKAGES="tests.testsite,tests.integration.avoid_site",
        CHAINCRAWL_POOL_DEVICE_ID_TESTSITE='{"low_water": 1, "target": 1}',
        CHAINCRAWL_RESOURCE_WAIT_MAX="5",  # unfixed, the page is dead-lettered after 5 s
    )
    key = f"avoid-{uuid.uuid4().hex[:8]}"  # 503 once, then the page
    run = chains.run(Chain("avoid_all", step("testsite.avoid.flaky")), seeds=[{"key": key}])
    p = run.wait(timeout=30)
    assert p.complete and p.totals["succeeded"] == 1 and p.totals["failed"] == 0, p.totals
    assert p.totals["retried"] == 1
    assert pool.stats()["checkouts"] == 2  # the retry got the device its first attempt failed with
    pool.clear()
