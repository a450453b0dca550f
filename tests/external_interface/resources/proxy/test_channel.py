"""Per-site channel pools: exclusive leased checkout, exact use counts, isolation, the races;
on one Redis and on a Redis Cluster (`[cluster]`: the global pool on the `{proxy}` slot, each
channel on its site's)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from config import Settings
from external_interface.resources.proxy.channel import ChannelPool, channel_stats, channels, settle
from external_interface.resources.proxy.models import Event, ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.proxy.validate import purge_channels
from monitor.health import proxy_health
from settings.proxy import ProxySettings
from tests.external_interface.stores import (
    connect,
    let_time_pass,
    rds_on_both_stores,  # noqa: F401 - fixture `rds`
)


def fill(pool: GlobalPool, n: int, score: float = 8.0) -> list[str]:
    """n validated members (fake addresses: the channel logic needs no network)."""
    ids = [f"10.20.{i // 250}.{i % 250 + 1}:3128" for i in range(n)]
    for pid in ids:
        pool.admit(ProxyAddress.parse(pid), elapsed=0.05 + len(ids) * 0.001)
        pool.rds.zadd(pool.keys.score, {pid: score})
    return ids


def test_checkout_is_exclusive_and_release_returns(pool: GlobalPool) -> None:
    ids = fill(pool, 3)
    ch = ChannelPool("a", pool)
    leases = [ch.checkout() for _ in range(3)]
    assert all(leases)
    assert sorted(x.id for x in leases if x) == sorted(ids)
    assert ch.checkout() is None  # everything is lent
    assert sorted(ch.lent()) == sorted(ids)
    assert ch.release(leases[0]) == "returned"  # type: ignore[arg-type]
    again = ch.checkout()
    assert again is not None and again.id == leases[0].id  # type: ignore[union-attr]
    assert again.uses == 1
    assert again.url == f"http://{again.id}"
    assert "http://" not in repr(again)  # the URL (maybe with credentials) stays out of repr


def test_least_used_first_and_counts_exact(pool: GlobalPool) -> None:
    fill(pool, 3)
    ch = ChannelPool("a", pool, parts=1)  # the order of one (sub-)pool
    used: Counter[str] = Counter()
    for _ in range(30):
        lease = ch.checkout()
        assert lease is not None
        used[lease.id] += 1
        ch.release(lease)
    assert sorted(used.values()) == [10, 10, 10]  # least used first spreads evenly
    assert dict(ch.idle()) == dict(used) == {i: ch.uses(i) for i in used}


def test_refill_never_re_adds_a_lent_proxy(pool: GlobalPool) -> None:
    """The double checkout through a refill: thread 1 holds X; thread 2 finds the channel empty
    and refills from the global pool, where X still is. X must not become idle a second time."""
    [x] = fill(pool, 1)
    ch1, ch2 = ChannelPool("a", pool), ChannelPool("a", pool)
    held = ch1.checkout()
    assert held is not None and held.id == x
    assert ch2.refill() == 0
    assert ch2.checkout() is None
    ch1.release(held)
    ch2.time_passed(1.0)  # its sub-pools all seen empty a second ago: it asks each again
    assert ch2.checkout() is not None


def test_return_counts_are_exact_under_concurrency(pool: GlobalPool, store_url: str) -> None:
    fill(pool, 5)
    rounds, threads = 40, 8

    def worker() -> None:
        ch = ChannelPool("a", GlobalPool(connect(store_url), pool.prefix, pool.settings))
        done = 0
        while done < rounds:
            lease = ch.checkout()
            if lease is None:
                time.sleep(0.001)
                continue
            ch.release(lease)
            done += 1

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    ch = ChannelPool("a", pool)
    idle = dict(ch.idle())
    assert sum(idle.values()) == rounds * threads
    assert idle == {pid: ch.uses(pid) for pid in idle}
    assert ch.lent() == []


def test_no_proxy_is_lent_twice_at_once(pool: GlobalPool, store_url: str) -> None:
    fill(pool, 6)
    holders: dict[str, int] = {}
    lock = threading.Lock()
    violations: list[str] = []
    checkouts = Counter[int]()
    stop = time.monotonic() + 2.0

    def worker(n: int) -> None:
        rds = connect(store_url)
        ch = ChannelPool("a", GlobalPool(rds, pool.prefix, pool.settings))
        while time.monotonic() < stop:
            lease = ch.checkout()
            if lease is None:
                continue
            with lock:
                if lease.id in holders:
                    violations.append(lease.id)
                holders[lease.id] = n
                checkouts[n] += 1
            time.sleep(0.0005)
            with lock:
                del holders[lease.id]
            ch.release(lease, Event.SUCCESS)
        rds.close()

    ts = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert violations == []
    assert sum(checkouts.values()) > 100
    assert len(checkouts) == 16  # every thread got proxies
    ch = ChannelPool("a", pool)
    assert sum(u for _, u in ch.idle()) == sum(checkouts.values())


def test_lease_of_a_dead_client_comes_back(pool: GlobalPool) -> None:
    [x] = fill(pool, 1)
    ch = ChannelPool("a", pool)
    orphan = ch.checkout(lease_ttl=60)  # its worker dies: never released
    assert orphan is not None
    assert ch.checkout() is None
    let_time_pass(ch.rds, ch, 61)
    back = ch.checkout()
    assert back is not None and back.id == x
    assert back.uses == 1  # the orphaned checkout counts as a use
    # the late return of the expired lease is fenced: it must not free the new holder's lease
    assert ch.release(orphan) == "stale"
    assert ch.lent() == [x]
    assert ch.checkout() is None
    assert ch.release(back) == "returned"
    assert ch.uses(x) == 3  # orphan, late return, and back


def test_reclaim_without_checkout(pool: GlobalPool) -> None:
    fill(pool, 3)
    ch = ChannelPool("a", pool)
    for _ in range(3):
        assert ch.checkout(lease_ttl=60)
    let_time_pass(ch.rds, ch, 61)
    assert ch.reclaim() == 3
    assert len(ch.idle()) == 3 and ch.lent() == []


def test_renew_extends_a_lease(pool: GlobalPool) -> None:
    fill(pool, 1)
    ch = ChannelPool("a", pool)
    lease = ch.checkout(lease_ttl=60)
    assert lease is not None
    let_time_pass(ch.rds, ch, 30)
    assert ch.renew(lease, lease_ttl=60)
    let_time_pass(ch.rds, ch, 40)  # 70 s after the checkout, 40 s after the renewal
    assert ch.checkout() is None  # still lent
    assert ch.release(lease) == "returned"
    late = ch.checkout(lease_ttl=60)
    let_time_pass(ch.rds, ch, 61)
    assert late is not None and not ch.renew(late)


def test_avoid_is_honoured(pool: GlobalPool) -> None:
    x, y, z = fill(pool, 3)
    ch = ChannelPool("a", pool)
    lease = ch.checkout(avoid={x})
    assert lease is not None and lease.id in (y, z)
    ch.release(lease)
    held = ch.checkout(avoid={x, y})
    assert held is not None and held.id == z
    assert ch.checkout(avoid={x, y}) is None  # z comes back: wait for it
    assert {pid for pid, _ in ch.idle()} == {x, y}


def test_avoiding_every_proxy_of_the_channel_still_lends_one(pool: GlobalPool) -> None:
    """A task that failed through every proxy of its site must not wait for good: `avoid` is
    a preference (tests/integration/test_avoid_starvation.py)."""
    x, y = fill(pool, 2)
    ch = ChannelPool("a", pool)
    used = ch.checkout(avoid={y})  # x, used once
    assert used is not None
    ch.release(used)
    lease = ch.checkout(avoid={x, y, "gone:1"})
    assert lease is not None and lease.id == y  # the least used of the avoided


def test_a_ban_on_site_a_leaves_site_b_alone(pool: GlobalPool) -> None:
    [x] = fill(pool, 1)
    a, b = ChannelPool("a", pool), ChannelPool("b", pool)
    lease_a = a.checkout()
    lease_b = b.checkout()  # the same proxy, lent to both sites at once: channels are separate
    assert lease_a is not None and lease_b is not None and lease_a.id == lease_b.id == x
    settle(pool, a, lease_a, x, Event.BANNED, 0.2)
    assert a.members() == set() and a.banned() == [x]
    assert a.refill() == 0 and a.checkout() is None  # the ban keeps it out of A
    assert pool.score(x) == 8  # the global pool does not care about one site's ban
    settle(pool, b, lease_b, x, Event.SUCCESS, 0.2)
    again = b.checkout()
    assert again is not None and again.id == x
    assert sorted(channels(pool)) == ["a", "b"]


def test_a_dead_proxy_leaves_global_and_that_channel_only(pool: GlobalPool) -> None:
    """The failing site drops it and deletes it globally; other channels keep their copy (they
    drop it on their own failure), new channels can no longer draw it."""
    [x] = fill(pool, 1)
    a, b, c = (ChannelPool(s, pool) for s in "abc")
    assert b.refill() == 1
    lease = a.checkout()
    assert lease is not None
    settle(pool, a, lease, x, Event.DEAD, 0.01)
    assert x not in pool
    assert a.members() == set()
    lease_b = b.checkout()
    assert lease_b is not None and lease_b.id == x and lease_b.url == f"http://{x}"
    assert c.checkout() is None


def test_ban_expires(pool: GlobalPool, rds: redis.Redis, key_prefix: str) -> None:
    settings = pool.settings.model_copy(update={"ban_ttl": 60})
    short = GlobalPool(rds, key_prefix, settings)
    [x] = fill(short, 1)
    ch = ChannelPool("a", short)
    lease = ch.checkout()
    assert lease is not None
    ch.release(lease, Event.BANNED)
    assert ch.checkout() is None
    let_time_pass(rds, ch, 59)
    assert ch.checkout() is None  # still benched
    let_time_pass(rds, ch, 2)
    again = ch.checkout()
    assert again is not None and again.id == x and again.uses == 0


def test_timeouts_to_zero_drop_from_the_channel(pool: GlobalPool) -> None:
    [x] = fill(pool, 1, score=1)
    ch = ChannelPool("a", pool)
    lease = ch.checkout()
    assert lease is not None
    settle(pool, ch, lease, x, Event.TIMEOUT, 10.0)
    assert x not in pool and ch.members() == set()


def test_validator_purge_reaches_every_channel(pool: GlobalPool) -> None:
    x, y = fill(pool, 2)
    for site in "ab":
        ChannelPool(site, pool).refill()
    held = ChannelPool("b", pool).checkout(avoid={y})
    assert held is not None and held.id == x
    assert purge_channels(pool, [x]) == 1  # idle in a; lent in b is left to fail on its own
    assert ChannelPool("a", pool).members() == {y}
    assert ChannelPool("b", pool).members() == {x, y}


def test_refill_takes_new_proxies_only_and_in_batches(
    rds: redis.Redis, key_prefix: str, proxy_settings: ProxySettings
) -> None:
    pool = GlobalPool(rds, key_prefix, proxy_settings.model_copy(update={"refill_batch": 4}))
    fill(pool, 10)
    ch = ChannelPool("a", pool)
    assert ch.refill() == 4
    assert ch.refill() == 4
    assert ch.refill() == 2
    assert ch.refill() == 0
    assert len(ch.members()) == 10


@pytest.mark.parametrize("n_threads", [32])
def test_checkout_from_many_threads_with_refill_storm(
    pool: GlobalPool, store_url: str, n_threads: int
) -> None:
    """Every thread starts on an empty channel, so refills race each other and checkouts."""
    fill(pool, 8)
    got: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(n_threads)

    def worker() -> None:
        ch = ChannelPool("storm", GlobalPool(connect(store_url), pool.prefix, pool.settings))
        barrier.wait()
        lease = ch.checkout()
        if lease is not None:
            with lock:
                got.append(lease.id)

    ts = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert len(got) == 8 and len(set(got)) == 8


def test_channel_stats_count_benches_and_drops_and_a_late_ban_still_benches(
    pool: GlobalPool,
) -> None:
    x, y = fill(pool, 2)
    ch = ChannelPool("a", pool)
    lease = ch.checkout(avoid={y})
    assert lease is not None and lease.id == x
    settle(pool, ch, lease, x, Event.DEAD, 0.01)
    assert channel_stats(ch) == {"dropped": 1}
    late = ch.checkout(lease_ttl=60)
    assert late is not None and late.id == y
    let_time_pass(ch.rds, ch, 61)
    again = ch.checkout()  # the expired lease was reclaimed: lent anew
    assert again is not None and again.id == y and again.uses == 1
    assert ch.release(late, Event.BANNED, ban_ttl=30) == "dropped"  # the site has spoken
    assert ch.banned() == [y] and ch.members() == set()
    assert channel_stats(ch) == {"banned": 1, "dropped": 1}
    assert ch.release(again) == "stale"


def test_proxies_lent_to_two_sites_on_different_slots(pool: GlobalPool) -> None:
    """The global pool on its `{proxy}` slot, each site's channel on the site's: the same
    proxies lent to both sites at once, scored in the global pool, listed by the health report."""
    x, y = fill(pool, 2)
    a, b = ChannelPool("a", pool), ChannelPool("b", pool)
    slots = {key_slot(k.encode()) for k in (a.k_idle, b.k_idle, pool.keys.score)}
    assert len(slots) == 3
    leases_a = [a.checkout() for _ in range(2)]
    leases_b = [b.checkout() for _ in range(2)]
    assert sorted(x.id for x in leases_a if x) == sorted(x.id for x in leases_b if x) == [x, y]
    assert a.checkout() is None and b.checkout() is None  # every proxy lent in both channels
    for ch, leases in ((a, leases_a), (b, leases_b)):
        for lease in leases:
            assert lease is not None
            settle(pool, ch, lease, lease.id, Event.SUCCESS, 0.1)
    assert pool.score(x) == pool.score(y) == 10  # 8 + 1 + 1: one success through each site
    assert dict(a.idle()) == dict(b.idle()) == {x: 1, y: 1}
    assert channels(pool) == ["a", "b"]
    health = {h.name: h.size for h in proxy_health(pool.rds, Settings(key_prefix=pool.prefix))}
    assert health == {"proxy": 2, "proxy:a": 2, "proxy:b": 2}


def test_a_proxy_leaving_the_global_pool_during_a_refill_stays_out_of_the_channel(
    pool: GlobalPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker removes the proxy after the refill read the global pool and before it
    adds it: one Redis refuses it in the add script, a cluster's second check takes it out."""
    x, y = fill(pool, 2)
    ch = ChannelPool("a", pool)
    add = ch.add_members

    def add_after_a_removal(*args: Any, **kw: Any) -> int:
        pool.remove(x, "dead")
        return add(*args, **kw)

    monkeypatch.setattr(ch, "add_members", add_after_a_removal)
    assert ch.refill() == 1
    assert ch.members() == {y}
    lease = ch.checkout()
    assert lease is not None and lease.id == y and ch.checkout() is None


def test_a_refill_asks_no_script_for_a_proxy_the_channel_benches(
    pool: GlobalPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refill's read of the channel leaves out proxies it benches: a low channel refilled
    while the site benches one does not call the add script for it each time (the script
    would skip it), and calls it again once the ban is over."""
    x, y = fill(pool, 2)
    ch = ChannelPool("a", pool)
    assert ch.refill() == 2
    lease = ch.checkout(avoid={y})
    assert lease is not None and lease.id == x
    ch.release(lease, Event.BANNED, ban_ttl=0.2)
    adds: list[Any] = []
    real = ch.add_members

    def add_members(*a: Any, **k: Any) -> int:
        adds.append(a)
        return real(*a, **k)

    monkeypatch.setattr(ch, "add_members", add_members)
    assert ch.refill() == 0 and adds == []
    time.sleep(0.25)
    assert ch.refill() == 1 and len(adds) == 1 and ch.members() == {x, y}


def test_refills_that_find_nothing_new_wait_longer_each_time(
    rds: redis.Redis, key_prefix: str, proxy_settings: ProxySettings
) -> None:
    """A channel kept low by its own leases (everything the selector ranks is in it) doubles
    the wait between watermark refills up to 5 s; a refill that adds one starts again."""
    pool = GlobalPool(rds, key_prefix, proxy_settings.model_copy(update={"refill_interval": 0.5}))
    fill(pool, 2)
    ch = ChannelPool("a", pool)
    assert ch.refill_wait() == 0.5
    assert ch.refill() == 2 and ch.refill_wait() == 0.5
    waits = []
    for _ in range(5):
        assert ch.refill() == 0
        waits.append(ch.refill_wait())
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    fill(pool, 3)  # a new proxy in the global pool
    assert ch.refill() == 1 and ch.refill_wait() == 0.5
