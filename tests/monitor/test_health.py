"""Pool health: pushed reports, live sources, and the proxy pool read from its own keys."""

from __future__ import annotations

import time

import pytest

from monitor import health
from monitor.health import PoolHealth


def test_reports_are_kept_in_redis_under_stable_names(rds, mon) -> None:
    health.report(rds, PoolHealth("cookie:shop", size=4, bans=1, produced=10), mon)
    health.add_produced(rds, "cookie:shop", 2, mon)
    assert rds.sismember(f"{mon.key_prefix}:health:pools", "cookie:shop")
    raw = rds.hgetall(f"{mon.key_prefix}:health:pool:cookie:shop")
    assert {k: raw[k] for k in (b"size", b"bans", b"produced")} == {
        b"size": b"4",
        b"bans": b"1",
        b"produced": b"12",
    }
    [h] = health.collect(rds, mon)
    assert (h.name, h.kind, h.site) == ("cookie:shop", "cookie", "shop")
    assert (h.size, h.bans, h.produced) == (4, 1, 12)
    assert h.source == "report" and h.age < 5 and not h.as_dict()["stale"]


def test_producers_can_count_on_a_pipeline(rds, mon) -> None:
    pipe = rds.pipeline()
    health.add_produced(pipe, "device:shop", 3, mon)
    pipe.execute()
    [h] = health.collect(rds, mon)
    assert (h.name, h.size, h.produced) == ("device:shop", 0, 3)


def test_stale_reports_are_flagged(rds, mon) -> None:
    health.report(rds, PoolHealth("cookie:old", size=2, updated=time.time() - 3600), mon)
    [h] = health.collect(rds, mon)
    assert h.as_dict()["stale"] and h.as_dict()["age"] >= 3599


def test_a_live_source_overrides_a_report_of_the_same_name(rds, mon) -> None:
    health.report(rds, PoolHealth("cookie:shop", size=1), mon)

    def source(client, s):
        return [PoolHealth("cookie:shop", size=9, bans=2), PoolHealth("ua", size=100)]

    def broken(client, s):
        raise RuntimeError("boom")

    health.register_source(source)
    health.register_source(broken)
    try:
        got = {h.name: h for h in health.collect(rds, mon)}
    finally:
        health._sources.remove(source)
        health._sources.remove(broken)
    assert got["cookie:shop"].size == 9 and got["cookie:shop"].source == "live"
    assert got["ua"].kind == "ua" and got["ua"].site == ""


def test_forget_removes_a_pool(rds, mon) -> None:
    health.report(rds, PoolHealth("cookie:shop", size=1), mon)
    health.forget(rds, "cookie:shop", mon)
    assert health.collect(rds, mon) == []


def test_the_proxy_pools_are_read_from_their_keys(rds, mon) -> None:
    pytest.importorskip("external_interface.resources.proxy.channel")
    from external_interface.resources.proxy.channel import ChannelPool
    from external_interface.resources.proxy.models import Event, ProxyAddress
    from external_interface.resources.proxy.pool import GlobalPool

    pool = GlobalPool(rds, prefix=mon.key_prefix)
    for i in range(3):
        pool.admit(ProxyAddress.parse(f"http://127.0.0.9:{8000 + i}"), 0.1)
    chan = ChannelPool("shop", pool)
    chan.refill()
    lease = chan.checkout()
    assert lease is not None
    chan.release(lease, Event.BANNED)
    got = {h.name: h for h in health.collect(rds, mon)}
    assert (got["proxy"].size, got["proxy"].produced) == (3, 3)
    assert got["proxy:shop"].kind == "proxy" and got["proxy:shop"].site == "shop"
    assert (got["proxy:shop"].size, got["proxy:shop"].bans) == (2, 1)


def test_no_proxy_pool_means_no_proxy_rows(rds, mon) -> None:
    assert health.proxy_health(rds, mon) == []


def test_the_cookie_pools_report_through_their_module(rds, mon) -> None:
    """external_interface.resources.cookie defines `pool_health`; collect() finds it by module name."""
    pytest.importorskip("external_interface.resources.cookie")
    from external_interface.resources.pool import Pool

    pool = Pool("cookie", "shop", rds=rds, prefix=mon.key_prefix)
    pool.add({"cookies": {"sid": "a"}})
    pool.add({"cookies": {"sid": "b"}})
    got = {h.name: h for h in health.collect(rds, mon)}
    assert got["cookie:shop"].size == 2 and got["cookie:shop"].kind == "cookie"
    assert got["cookie:shop"].source == "live"
