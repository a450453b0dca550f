"""The state stores the pool, lease and proxy tests run on: one Redis and a Redis Cluster.

A test module that runs on both imports `rds_on_both_stores`, which overrides its `rds`
with a client of `store_url`: the session Redis, then the session cluster
(`redis+cluster://...`), so the same test checks that every script of the module keeps its
keys on one cluster slot.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from config import is_cluster_url
from external_interface.resources.lease import LeasePool
from utils.redis import cluster_client

STORES = ["redis", pytest.param("cluster", marks=pytest.mark.integration)]


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest) -> str:
    if request.param == "cluster":
        return str(request.getfixturevalue("redis_cluster").url)
    return str(request.getfixturevalue("redis_url"))


def connect(url: str) -> Any:
    """A client of either store (a `RedisCluster` for a cluster URL)."""
    return cluster_client(url) if is_cluster_url(url) else redis.Redis.from_url(url)


@pytest.fixture(name="rds")
def rds_on_both_stores(store_url: str) -> Iterator[Any]:
    """`rds` on one Redis, then on a Redis Cluster."""
    client = connect(store_url)
    yield client
    client.close()


def let_time_pass(rds: Any, pool: LeasePool, seconds: float) -> None:
    """As if `seconds` had gone by on Redis's clock for `pool`: its lease expiries, bans and
    (in the `lru` order) cool-downs move that much into the past. Tests of expiry use long
    times and this instead of a sleep, so a loaded machine can neither end a lease early nor
    leave it running late."""
    shift = seconds * 1000
    lru = pool.profile.order == "lru"
    keys = [k for part in pool.part_keys for k in [part[1], part[8]] + ([part[0]] if lru else [])]
    for key in keys:  # every sub-pool's
        scores = rds.zrange(key, 0, -1, withscores=True)
        if scores:
            rds.zadd(key, {member: score - shift for member, score in scores}, xx=True)
    pool.time_passed(seconds)  # and for what the instance remembers of its sub-pools


def let_ttl_pass(rds: Any, key: str, seconds: float) -> None:
    """As if `seconds` had gone by for a key with a TTL: it lives that much less (gone when
    nothing is left)."""
    left = rds.pttl(key)
    if left < 0:
        return  # no such key, or no TTL
    if left <= seconds * 1000:
        rds.delete(key)
    else:
        rds.pexpire(key, int(left - seconds * 1000))
