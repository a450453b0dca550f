"""A process's share of a proxy channel (`hold_share`, share.py): each process holding from
a channel keeps at most ceil(members / live processes); one at its share waits for its own
proxies with no Redis call, one over it gives the extra back at their next return, and a
process that stops refreshing (crashed) or leaves stops counting. Two processes are two
holdings of one channel (two clients); real Redis, no assertion on timing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from external_interface.resources import holding, share
from external_interface.resources.pool import Pool, configure_pool
from external_interface.resources.proxy.channel import ChannelPool
from external_interface.resources.proxy.models import ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from settings.proxy import ProxySettings
from utils.redis import cluster_client


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    holding.set_enabled(True)  # the directory's conftest turns it off for the engine's tests
    holding.forget()
    monkeypatch.setattr(share, "EVERY", 0.0)  # every take refreshes the count: no waiting
    yield
    holding.forget()


def process(
    rds: redis.Redis, prefix: str, name: str, url: str
) -> tuple[ChannelPool, holding.Holding]:
    """One worker process's channel of site `name`: a client of its own, so a holding of its
    own (holdings are per pool and client)."""
    client = redis.Redis.from_url(url)
    pool = GlobalPool(client, prefix, ProxySettings(refill_interval=0.0))
    ch = ChannelPool(name, pool, held=True, parts=1)
    h = ch.holding()
    assert h is not None and h.rule.share
    return ch, h


def setup(rds: redis.Redis, prefix: str, proxies: int, **cfg: Any) -> tuple[str, list[str]]:
    name = f"s{uuid.uuid4().hex[:8]}"
    configure_pool("proxy", name, hold_wait=0.0, **cfg)
    pool = GlobalPool(rds, prefix, ProxySettings(refill_interval=0.0))
    ids = [f"10.31.0.{i + 1}:3128" for i in range(proxies)]
    for pid in ids:
        pool.admit(ProxyAddress.parse(pid), elapsed=0.05)
        pool.rds.zadd(pool.keys.score, {pid: 8.0})
    assert ChannelPool(name, pool, parts=1).refill() == proxies
    return name, ids


def test_a_process_at_its_share_waits_for_its_own_proxies_with_no_redis_call(
    rds: redis.Redis, redis_url: str, key_prefix: str, held: None
) -> None:
    """4 proxies, 2 processes: each holds at most 2. A third take of the first process, both
    of its proxies in use, asks Redis nothing and takes nothing though the channel has one
    idle (without the share it would take it); a proxy of its own given back serves it."""
    name, _ = setup(rds, key_prefix, 4)
    ch_a, a = process(rds, key_prefix, name, redis_url)
    ch_b, _ = process(rds, key_prefix, name, redis_url)
    one_b = ch_b.checkout()  # b counts from now on
    assert one_b is not None
    first, second = ch_a.checkout(), ch_a.checkout()
    assert first is not None and second is not None
    assert a.share is not None and (a.share.processes, a.share.members, a.share.limit) == (2, 4, 2)
    calls = a.calls
    lease, _ = ch_a.lend()
    assert lease is None and a.calls == calls and a.capped == 1
    assert len(ch_a.idle()) == 1  # left in the channel for the other process
    ch_a.release(first)  # kept in this process (within its bounds, at its share)
    again = ch_a.checkout()
    assert again is not None and again.id == first.id and a.calls == calls
    assert len(ch_a.idle()) == 1 and len(a) == 2


def test_a_process_over_its_share_gives_the_extra_proxies_back_at_their_return(
    rds: redis.Redis, redis_url: str, key_prefix: str, held: None
) -> None:
    """Alone, a process holds what it takes (no share); once a second process holds from the
    channel, the first gives back what it has over its share as those proxies come back
    from their requests, and keeps the rest."""
    name, _ = setup(rds, key_prefix, 4)
    ch_a, a = process(rds, key_prefix, name, redis_url)
    leases = [ch_a.checkout() for _ in range(4)]
    assert all(x is not None for x in leases) and a.share is not None and a.share.limit is None
    ch_b, b = process(rds, key_prefix, name, redis_url)
    assert ch_b.checkout() is None  # b counts from now on; the channel has none idle
    assert ch_a.lend()[0] is None  # a refreshes: share 2, at it (all four in use)
    assert a.share.limit == 2
    for lease in leases:
        assert lease is not None and ch_a.release(lease) == "returned"
    assert len(a) == 2 and len(ch_a.idle()) == 2
    b.refreshed()  # its 'nothing ready' of a moment ago, forgotten
    got = ch_b.checkout()
    assert got is not None and got.id not in a.held()


def test_a_process_that_stops_counting_leaves_its_share_to_the_others(
    rds: redis.Redis, redis_url: str, key_prefix: str, held: None
) -> None:
    """A crashed process's entry runs out (as if its TTL had passed: its time moved into the
    past) and one that shuts down removes its own: the other's share is the whole channel
    again. The crashed one's leases still come back by their own expiry only (the engine's)."""
    name, _ = setup(rds, key_prefix, 4)
    ch_a, a = process(rds, key_prefix, name, redis_url)
    ch_b, b = process(rds, key_prefix, name, redis_url)
    ch_c, c = process(rds, key_prefix, name, redis_url)
    lease_c = ch_c.checkout()
    assert ch_b.checkout() is not None and lease_c is not None
    assert ch_a.checkout() is not None and a.share is not None and a.share.limit == 2
    key = share.holders_key(ch_a)
    assert b.share is not None and c.share is not None
    rds.zadd(key, {b.share.holder: int(time.time() * 1000) - 1})  # b crashed a TTL ago
    assert ch_a.checkout() is not None and a.share.processes == 2 and len(a) == 2
    ch_c.release(lease_c)
    c.return_all()  # c shuts down: its proxy back to the channel, its entry gone
    assert rds.zscore(key, c.share.holder) is None
    assert ch_a.checkout() is not None  # c's: alone now, no share
    assert a.share.processes == 1 and a.share.limit is None and len(a) == 3
    assert ch_a.checkout() is None  # b's is lent to the crashed process until it expires


def test_the_share_never_keeps_a_take_from_a_proxy_it_does_not_avoid(
    rds: redis.Redis, redis_url: str, key_prefix: str, held: None
) -> None:
    """A take that avoids every proxy this process holds (they failed it) may not wait for
    them: it takes one more from the channel, over the share, and that one goes back at its
    return."""
    name, _ = setup(rds, key_prefix, 4)
    ch_a, a = process(rds, key_prefix, name, redis_url)
    ch_b, _ = process(rds, key_prefix, name, redis_url)
    assert ch_b.checkout() is not None
    mine = [ch_a.checkout(), ch_a.checkout()]
    assert all(x is not None for x in mine) and len(a) == 2
    other = ch_a.checkout(avoid=[x.id for x in mine if x is not None])
    assert other is not None and other.id not in {x.id for x in mine if x is not None}
    assert ch_a.release(other) == "returned" and len(a) == 2 and other.id not in a.held()


def test_pool_clear_drops_the_count(
    rds: redis.Redis, redis_url: str, key_prefix: str, held: None
) -> None:
    name, _ = setup(rds, key_prefix, 2)
    ch_a, _ = process(rds, key_prefix, name, redis_url)
    assert ch_a.checkout() is not None and rds.exists(share.holders_key(ch_a))
    ch_a.clear()
    assert not rds.exists(share.holders_key(ch_a))


def test_a_proxy_back_to_a_drained_channel_is_not_asked_for_during_its_rest(
    rds: redis.Redis, redis_url: str, key_prefix: str, held: None
) -> None:
    """A held proxy that goes back (its time bound: 0 here) rests in the channel; when the
    channel had nothing else ready, the process's next take asks Redis nothing while it
    rests (it would only find it resting). With another proxy ready, it asks and gets it."""
    name, _ = setup(rds, key_prefix, 1, cooldown=30, hold_seconds=0)
    ch, h = process(rds, key_prefix, name, redis_url)
    lease = ch.checkout()
    assert lease is not None and h.available == 0
    assert ch.release(lease) == "returned" and len(h) == 0  # back to the channel, resting
    calls = h.calls
    assert ch.checkout() is None and h.calls == calls

    name, _ = setup(rds, key_prefix, 2, cooldown=30, hold_seconds=0)
    ch, h = process(rds, key_prefix, name, redis_url)
    first = ch.checkout()
    assert first is not None and h.available == 1
    assert ch.release(first) == "returned"
    second = ch.checkout()
    assert second is not None and second.id != first.id


@pytest.mark.integration
def test_the_count_reads_every_sub_pool_on_a_cluster(redis_cluster: Any, key_prefix: str) -> None:
    """The refresh's pipeline names the holders' slot and each sub-pool's: on a Redis Cluster
    it still counts the processes and every part's members."""
    client = cluster_client(str(redis_cluster.url))
    try:
        pool = Pool("cookie", "shop", rds=client, prefix=key_prefix, parts=3)  # type: ignore[arg-type]
        for i in range(7):
            pool.add({"cookies": {"session": f"s{i}"}}, f"c{i}")
        assert len({pool.home(f"c{i}") for i in range(7)}) > 1  # members in more than one part
        one, two = share.Share(pool), share.Share(pool)
        one.refresh()
        two.refresh()
        assert (two.processes, two.members, two.limit) == (2, 7, 4)
        one.leave()
        two.refresh()
        assert (two.processes, two.limit) == (1, None)
        pool.clear()
    finally:
        client.close()
