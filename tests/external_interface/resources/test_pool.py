"""The Redis pool under cookies and devices: rotation, cool-down, use limits, exclusive checkout
under concurrency, health score, ban -> retire, lease expiry, health reports; on one Redis and
on a Redis Cluster (`[cluster]`)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from config import Settings
from external_interface.resources import pool as pool_module
from external_interface.resources.pool import (
    Pool,
    PoolConfig,
    Producer,
    pool_config,
    pool_stats,
    register_producer,
    reset_pool_config,
)
from external_interface.resources.rules import Verdict
from tests.external_interface.stores import (
    let_time_pass,
    rds_on_both_stores,  # noqa: F401 - fixture `rds`
)


def make(
    rds: redis.Redis, prefix: str, n: int = 0, parts: int | None = None, **cfg: object
) -> Pool:
    pool = Pool("cookie", "shop", rds=rds, prefix=prefix, config=PoolConfig(**cfg), parts=parts)  # type: ignore[arg-type]
    for i in range(n):
        pool.add({"cookies": {"session": f"secret-{i}"}}, f"c{i}")
    return pool


def test_checkout_lends_each_member_exclusively(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 2)
    a = pool.checkout()
    b = pool.checkout()
    c = pool.checkout()
    assert a.lease and b.lease and c.lease is None
    assert {a.lease.id, b.lease.id} == {"c0", "c1"}
    assert a.lease.secret == {"cookies": {"session": f"secret-{a.lease.id[1:]}"}}
    assert c.size == 2 and c.available == 0 and c.wait is None  # nothing idle: no ETA
    assert "secret" not in repr(a.lease)


def test_rotation_gives_the_least_recently_used(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 3, parts=1)  # the order of one (sub-)pool
    time.sleep(0.002)  # ready-at has millisecond resolution: ties go by id
    order = []
    for _ in range(6):
        co = pool.checkout()
        assert co.lease is not None
        order.append(co.lease.id)
        pool.release(co.lease, Verdict.OK)
        time.sleep(0.002)  # distinct ready-at milliseconds
    assert order[:3] == order[3:]
    assert sorted(order[:3]) == ["c0", "c1", "c2"]
    assert Counter(order) == {"c0": 2, "c1": 2, "c2": 2}


def test_cooldown_rests_a_member_and_tells_how_long(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 1, cooldown=60)
    co = pool.checkout()
    pool.release(co.lease, Verdict.OK)  # type: ignore[arg-type]
    again = pool.checkout()
    assert again.lease is None and again.size == 1
    assert again.wait is not None and 30 < again.wait <= 60
    s = pool.stats()
    assert s["cooling"] == 1 and s["available"] == 0
    let_time_pass(rds, pool, again.wait - 1)
    assert pool.checkout().lease is None  # still resting
    let_time_pass(rds, pool, 2)
    assert pool.checkout().lease is not None


def test_use_limit_retires(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 1, max_uses=3)
    for i in range(3):
        co = pool.checkout()
        assert co.lease is not None and co.lease.uses == i
        state, size = pool.release(co.lease, Verdict.NEUTRAL)
    assert (state, size) == ("retired", 0)
    assert pool.checkout().lease is None
    s = pool.stats()
    assert s["retired_by"] == {"used_up": 1} and s["size"] == 0
    assert pool.retired() == ["c0"]


def test_health_score_rises_on_success_and_failures_retire(
    rds: redis.Redis, key_prefix: str
) -> None:
    pool = make(rds, key_prefix, 1, initial_score=5, max_score=7, fail_penalty=2)
    for _ in range(4):
        pool.release(pool.checkout().lease, Verdict.OK)  # type: ignore[arg-type]
    assert pool.score("c0") == 7  # capped
    states = [pool.release(pool.checkout().lease, Verdict.FAILED)[0] for _ in range(4)]  # type: ignore[arg-type]
    assert states == ["returned", "returned", "returned", "retired"]  # 7 -> 5 -> 3 -> 1 -> -1
    assert pool.stats()["retired_by"] == {"unhealthy": 1}


def test_ban_retires_and_deletes_the_secret(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 2)
    co = pool.checkout()
    assert pool.release(co.lease, Verdict.BANNED)[0] == "retired"  # type: ignore[arg-type]
    assert co.lease.id not in pool  # type: ignore[union-attr]
    assert rds.hget(pool.k_secret, co.lease.id) is None  # type: ignore[union-attr]
    s = pool.stats()
    assert (
        s["bans"] == 1 and s["retired"] == 1 and s["retired_by"] == {"banned": 1} and s["size"] == 1
    )


def test_expired_lease_is_reclaimed_and_its_late_return_is_stale(
    rds: redis.Redis, key_prefix: str
) -> None:
    pool = make(rds, key_prefix, 1, lease_ttl=60)
    first = pool.checkout().lease
    assert pool.checkout().lease is None
    let_time_pass(rds, pool, 61)
    second = pool.checkout().lease  # the holder vanished: lent again
    assert second is not None and second.id == first.id  # type: ignore[union-attr]
    assert pool.release(first, Verdict.OK)[0] == "stale"  # type: ignore[arg-type]
    assert pool.uses("c0") == 0  # the stale return counted nothing
    assert pool.release(second, Verdict.OK)[0] == "returned"
    assert pool.stats()["reclaimed"] == 1


def test_a_ban_retires_even_after_the_lease_was_reclaimed(
    rds: redis.Redis, key_prefix: str
) -> None:
    pool = make(rds, key_prefix, 1, lease_ttl=60)
    first = pool.checkout().lease
    let_time_pass(rds, pool, 61)
    pool.checkout()
    assert pool.release(first, Verdict.BANNED)[0] == "retired"  # type: ignore[arg-type]
    assert len(pool.ids()) == 0


def test_avoid_skips_members_a_task_failed_with(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 3)
    co = pool.checkout(avoid={"c0", "c1"})
    assert co.lease is not None and co.lease.id == "c2"
    assert pool.checkout(avoid={"c0", "c1"}).lease is None
    assert pool.checkout().lease is not None


def test_cancel_returns_without_a_use(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 1, cooldown=10)
    pool.cancel(pool.checkout().lease)  # type: ignore[arg-type]
    assert pool.uses("c0") == 0
    assert pool.checkout().lease is not None  # no cool-down either


def test_add_is_idempotent_per_id(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix)
    assert pool.add({"cookies": {"s": "1"}}, "x") == "x"
    assert pool.add({"cookies": {"s": "2"}}, "x") is None
    assert pool.stats()["produced"] == 1
    generated = pool.add({"cookies": {"s": "3"}})
    assert generated and generated.startswith("co-")


def test_concurrent_checkouts_never_share_a_member(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 5)
    held: set[str] = set()
    lock = threading.Lock()
    errors: list[str] = []
    got: Counter[str] = Counter()

    def worker() -> None:
        for _ in range(60):
            co = pool.checkout()
            if co.lease is None:
                continue
            with lock:
                if co.lease.id in held:
                    errors.append(co.lease.id)
                held.add(co.lease.id)
                got[co.lease.id] += 1
            time.sleep(0.001)
            with lock:
                held.discard(co.lease.id)
            pool.release(co.lease, Verdict.OK)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert set(got) == {f"c{i}" for i in range(5)}
    s = pool.stats()
    assert s["leased"] == 0 and s["checkouts"] == sum(got.values())
    assert sum(pool.uses(f"c{i}") or 0 for i in range(5)) == sum(got.values())


def test_stats_and_monitor_health(rds: redis.Redis, key_prefix: str) -> None:
    from monitor.health import collect

    pool = make(rds, key_prefix, 3, cooldown=30)
    pool.release(pool.checkout().lease, Verdict.OK)  # type: ignore[arg-type]
    pool.checkout()
    s = pool_stats(rds, key_prefix)["cookie:shop"]
    assert (s["size"], s["available"], s["cooling"], s["leased"], s["produced"]) == (3, 1, 1, 1, 3)
    health = {h.name: h for h in collect(rds, Settings(key_prefix=key_prefix))}
    h = health["cookie:shop"]
    assert (h.kind, h.site, h.size, h.bans, h.produced) == ("cookie", "shop", 3, 1, 3)


def test_config_from_code_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from external_interface.resources.pool import configure_pool

    configure_pool("cookie", "cfgsite", cooldown=2, target=9)
    monkeypatch.setenv("CHAINCRAWL_POOL_COOKIE", '{"max_uses": 40, "cooldown": 1}')
    monkeypatch.setenv("CHAINCRAWL_POOL_COOKIE_CFGSITE", '{"low_water": "3"}')
    reset_pool_config()
    try:
        cfg = pool_config("cookie", "cfgsite")
        assert (cfg.cooldown, cfg.target, cfg.max_uses, cfg.low_water) == (1.0, 9, 40, 3)
    finally:
        monkeypatch.delenv("CHAINCRAWL_POOL_COOKIE")
        monkeypatch.delenv("CHAINCRAWL_POOL_COOKIE_CFGSITE")
        reset_pool_config()


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ('{"low_watr": 3}', ": unknown pool setting 'low_watr'; did you mean 'low_water'?"),
        ("[3]", ' must be a JSON object like {"target": 6}'),
        ("low_water=3", ' must be a JSON object like {"target": 6}'),
    ],
)
def test_a_pool_variable_it_cannot_use_is_an_error(
    monkeypatch: pytest.MonkeyPatch, raw: str, said: str
) -> None:
    """A misspelled key used to be dropped without a word, the pool running on its default."""
    from exceptions import ConfigError

    monkeypatch.setenv("CHAINCRAWL_POOL_COOKIE_CFGSITE", raw)
    reset_pool_config()
    try:
        with pytest.raises(ConfigError) as exc:
            pool_config("cookie", "cfgsite")
        assert str(exc.value) == f"CHAINCRAWL_POOL_COOKIE_CFGSITE{said}"
    finally:
        monkeypatch.delenv("CHAINCRAWL_POOL_COOKIE_CFGSITE")
        reset_pool_config()


def test_pools_of_two_sites_on_different_slots_lend_produce_and_all_show_in_stats(
    rds: Any, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each site's pools on the site's slot, the registry of pools on a third: leases,
    production and the stats listing every pool work across them (on a cluster, the slots of
    sites "a" and "b" are on two different masters)."""
    cookies_a = Pool("cookie", "a", rds=rds, prefix=key_prefix, config=PoolConfig())
    cookies_b = Pool("cookie", "b", rds=rds, prefix=key_prefix, config=PoolConfig())
    devices_b = Pool("device_id", "b", rds=rds, prefix=key_prefix, config=PoolConfig())
    slots = {key_slot(k.encode()) for k in (cookies_a.k_idle, cookies_b.k_idle, cookies_a.k_pools)}
    assert len(slots) == 3
    assert key_slot(cookies_b.k_producing.encode()) == key_slot(devices_b.k_secret.encode())
    for pool in (cookies_a, cookies_b, devices_b):
        pool.add({"cookies": {"site": pool.site}}, f"{pool.kind[:2]}-1")
    leases = {p.name: p.checkout().lease for p in (cookies_a, cookies_b, devices_b)}
    assert {name: lease.secret["cookies"]["site"] for name, lease in leases.items() if lease} == {
        "cookie:a": "a",
        "cookie:b": "b",
        "device_id:b": "b",
    }
    assert cookies_a.release(leases["cookie:a"], Verdict.OK) == ("returned", 1)  # type: ignore[arg-type]
    monkeypatch.setattr(pool_module, "_PRODUCERS", {})  # registered for this test only
    register_producer("cookie", "b", Producer("test", lambda s, r: None, lambda r: False))
    started: list[str] = []
    rid = cookies_b.try_start_production(2, start=lambda p, s, r: started.append(r))
    assert rid is not None and started == [rid]
    assert cookies_b.try_start_production(2, start=lambda p, s, r: started.append(r)) is None
    stats = pool_stats(rds, key_prefix)
    assert sorted(stats) == ["cookie:a", "cookie:b", "device_id:b"]
    assert [(s["size"], s["leased"], s["checkouts"]) for s in stats.values()] == [
        (1, 0, 1),
        (1, 1, 1),
        (1, 1, 1),
    ]
    assert stats["cookie:b"]["production_runs"] == 1 and stats["cookie:b"]["last_run"] == rid
