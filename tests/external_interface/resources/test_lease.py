"""The lease engine under every pool: both orders, lost uses, the bench, the source guard,
retirement of idle members only, full reclaim, renew, and the one registry of leases in flight
that cookies, devices and proxies share; on one Redis and on a Redis Cluster (`[cluster]`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest
import redis

from exceptions import SecretUnreadable
from external_interface.resources.base import OutgoingRequest
from external_interface.resources.inflight import (
    IN_FLIGHT,
    LeasesInFlight,
    avoid_next_time,
    avoided,
    cancel_leases,
)
from external_interface.resources.lease import LeasePool, Profile
from tests.external_interface.stores import (
    let_time_pass,
    rds_on_both_stores,  # noqa: F401 - fixture `rds`
)
from utils.keyspace import Keyspace
from utils.seal import Sealer
from utils.secretfile import new_key

CHANNEL = Profile(order="uses", lost_uses=True, scored=False, produced=False)


def make(rds: redis.Redis, prefix: str, n: int = 0, profile: Profile = Profile()) -> LeasePool:
    pool = LeasePool("thing", "shop", Keyspace(prefix).pool("thing", "shop"), rds=rds,
                     profile=profile)  # fmt: skip
    pool.add_members([(f"m{i}", f"secret-{i}") for i in range(n)], initial_score=5)
    return pool


def test_unknown_orders_and_actions_are_refused(rds: redis.Redis, key_prefix: str) -> None:
    with pytest.raises(ValueError, match="unknown lease order 'fifo'"):
        Profile(order="fifo")
    pool = make(rds, key_prefix, 1)
    lease = pool.take((), 10).lease
    assert lease is not None
    with pytest.raises(ValueError, match="unknown lease action 'banned'"):
        pool.give_back(lease, "banned")
    assert pool.lent() == ["m0"]  # nothing happened to the lease


def test_lru_order_lends_the_member_idle_longest_and_rests_it(
    rds: redis.Redis, key_prefix: str
) -> None:
    pool = make(rds, key_prefix, 2)
    first = pool.take((), 10).lease
    assert first is not None and first.id == "m0" and first.secret == "secret-0"
    assert pool.give_back(first, rest=30) == ("returned", 2)
    co = pool.take((), 10)
    assert co.lease is not None and co.lease.id == "m1"
    assert pool.take((), 10).lease is None  # m0 rests, m1 is lent
    assert pool.sizes() == (0, 2, 1)


def test_uses_order_lends_the_least_used_and_keeps_its_count_in_idle(
    rds: redis.Redis, key_prefix: str
) -> None:
    pool = make(rds, key_prefix, 3, Profile(order="uses"))
    for _ in range(2):
        lease = pool.take(["m2"], 10).lease
        assert lease is not None and lease.id in ("m0", "m1")
        pool.give_back(lease)
    scores = dict(
        cast("list[tuple[bytes, float]]", rds.zrange(pool.k_idle, 0, -1, withscores=True))
    )
    assert scores == {b"m0": 1.0, b"m1": 1.0, b"m2": 0.0}
    lease = pool.take((), 10).lease
    assert lease is not None and lease.id == "m2"  # the least used goes first
    pool.cancel(lease)  # never sent: not a use
    assert pool.uses("m2") == 0 and rds.zscore(pool.k_idle, "m2") == 0


@pytest.mark.parametrize("order", ["lru", "uses"])
def test_an_empty_checkout_reads_no_count_and_says_when_a_resting_one_is_ready(
    rds: redis.Redis, key_prefix: str, order: str
) -> None:
    """A checkout that finds no candidate reads no count (nothing is ready: the caller hears
    0 available); in the lru order it still says when the resting member is ready."""
    pool = make(rds, key_prefix, 1, Profile(order=order, produced=False))  # no size read
    lease = pool.take((), 10).lease
    assert lease is not None
    empty = pool.take((), 10)
    assert empty.lease is None and empty.available == 0 and empty.wait is None
    pool.give_back(lease, rest=30)
    co = pool.take((), 10)
    if order == "lru":  # resting 30 s: nothing ready, the wait told
        assert co.lease is None and co.available == 0 and co.wait is not None
        assert 29 <= co.wait <= 30
    else:  # resting 30 s in :lease (its idle score is its use count): not lent, not idle
        assert co.lease is None and co.available == 0
        let_time_pass(rds, pool, 31)
        again = pool.take((), 10).lease
        assert again is not None and again.uses == 1  # back by itself, no use counted
    if not isinstance(rds, redis.RedisCluster):
        rds.config_resetstat()
        pool.take((), 10)
        stats = rds.info("commandstats")
        assert "cmdstat_zcard" not in stats and "cmdstat_zcount" not in stats


@pytest.mark.parametrize(("lost", "uses"), [(False, 0), (True, 2)])
def test_lost_uses_count_a_reclaimed_lease_and_its_late_return(
    rds: redis.Redis, key_prefix: str, lost: bool, uses: int
) -> None:
    pool = make(rds, key_prefix, 1, Profile(order="uses", lost_uses=lost))
    orphan = pool.take((), 60).lease
    assert orphan is not None
    let_time_pass(rds, pool, 61)
    assert pool.reclaim() == 1
    assert pool.give_back(orphan)[0] == "stale"  # the token no longer matches
    assert pool.uses("m0") == uses
    assert pool.counters()["reclaimed"] == 1
    if lost:  # an idle member's rank follows its count
        assert rds.zscore(pool.k_idle, "m0") == uses


def test_reclaim_takes_back_more_than_one_batch(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 80)
    for _ in range(80):
        assert pool.take((), 60).lease is not None
    let_time_pass(rds, pool, 61)
    assert pool.reclaim() == 80
    assert pool.lent() == [] and pool.sizes() == (80, 80, 0)


def test_a_ban_benches_the_id_until_its_hold_ends(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 1)
    lease = pool.take((), 10).lease
    assert lease is not None
    assert pool.give_back(lease, "ban", reason="banned", hold=60) == ("retired", 0)
    assert pool.banned() == ["m0"] and pool.retired() == ["m0"] and "m0" not in pool
    assert pool.add_members([("m0", "again")]) == 0  # benched
    let_time_pass(rds, pool, 59)
    assert pool.banned() == ["m0"]
    let_time_pass(rds, pool, 2)
    assert pool.banned() == []
    assert pool.add_members([("m0", "again")]) == 1
    c = pool.counters()
    assert (c["bans"], c["retired"], c["retired:banned"], c["produced"]) == (1, 1, 1, 2)


def test_a_ban_on_an_expired_lease_still_retires_whoever_holds_it_now(
    rds: redis.Redis, key_prefix: str
) -> None:
    pool = make(rds, key_prefix, 1, CHANNEL)
    late = pool.take((), 60).lease
    let_time_pass(rds, pool, 61)
    now = pool.take((), 10).lease  # reclaimed and lent again
    assert late is not None and now is not None and now.id == late.id
    assert pool.give_back(late, "ban", reason="banned", hold=60)[0] == "retired"
    assert pool.members() == set() and pool.lent() == []
    assert pool.give_back(now) == ("stale", -1)  # finds nothing; this profile reports no size


def test_add_with_a_source_takes_only_its_members(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, profile=CHANNEL)
    source = Keyspace(key_prefix).site("shop", "source")  # the pool's slot
    rds.zadd(source, {"a": 1})
    assert pool.add_members([("a", "url-a"), ("b", "url-b")], source=source) == 1
    assert pool.members() == {"a"}
    assert pool.add_members([("a", "other")], source=source) == 0  # known: kept as it is
    assert pool.sealer.open(rds.hget(pool.k_secret, "a") or b"") == "url-a"
    assert pool.score("a") is None  # an unscored profile keeps no score


def test_retire_only_idle_leaves_lent_members(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 2)
    held = pool.take(["m1"], 10).lease
    assert held is not None and held.id == "m0"
    assert pool.retire_members(["m0", "m1", "gone"], "purged", only_idle=True) == 1
    assert pool.members() == {"m0"}
    assert pool.counters()["retired:purged"] == 1


def test_renew_extends_only_the_current_lease(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 1)
    lease = pool.take((), 60).lease
    assert lease is not None
    let_time_pass(rds, pool, 30)
    assert pool.renew_lease(lease, 60)
    let_time_pass(rds, pool, 40)  # 70 s after the checkout, 40 s after the renewal
    assert pool.take((), 1).lease is None  # still lent
    assert pool.give_back(lease)[0] == "returned"
    assert not pool.renew_lease(lease, 1.0)  # that lease is over


def test_score_moves_and_a_member_at_zero_is_retired(rds: redis.Redis, key_prefix: str) -> None:
    pool = make(rds, key_prefix)
    pool.add_members([("m", "s")], initial_score=2)
    for delta, want in ((1, "returned"), (0, "returned"), (-3, "retired")):
        lease = pool.take((), 10).lease
        assert lease is not None
        assert pool.give_back(lease, delta=delta, max_score=10)[0] == want
    assert pool.counters()["retired:unhealthy"] == 1


def test_lent_finds_a_lease_by_request_or_by_a_copys_member_id(
    rds: redis.Redis, key_prefix: str
) -> None:
    pool = make(rds, key_prefix, 2)
    lent = LeasesInFlight()
    req = OutgoingRequest("GET", "http://127.0.0.1:9/")
    lease = pool.take((), 10).lease
    assert lease is not None
    lent.put(req, pool, lease)
    assert req.leases == {"thing": lease.id}
    assert lent.take(req, pool) == (pool, lease)
    assert lent.take(req, pool) is None  # taken once
    lent.put(req, pool, lease)
    copy = OutgoingRequest("GET", req.url, leases=dict(req.leases))
    assert lent.take(copy, pool) == (pool, lease)


def test_cancel_leases_gives_back_every_kind_lent_for_a_request(
    rds: redis.Redis, key_prefix: str
) -> None:
    """One registry for every kind: a proxy lent before a cookie pool turned the request
    down goes back with the rest (it used to stay lent until its lease expired)."""
    proxies = LeasePool("proxy", "shop", Keyspace(key_prefix).proxy_channel("shop"), rds=rds,
                        profile=CHANNEL)  # fmt: skip
    cookies = make(rds, key_prefix, 1)
    proxies.add_members([("1.2.3.4:80", "http://1.2.3.4:80")])
    req = OutgoingRequest("GET", "http://127.0.0.1:9/")
    for pool in (proxies, cookies):
        lease = pool.take((), 10).lease
        assert lease is not None
        IN_FLIGHT.put(req, pool, lease)
    cancel_leases(req)
    assert req.leases == {}
    assert proxies.lent() == [] and cookies.lent() == []
    assert proxies.uses("1.2.3.4:80") == 0 and cookies.counters()["cancelled"] == 1


def test_avoid_list_helpers() -> None:
    task = SimpleNamespace(avoid={"thing:a", "proxy:b"})
    avoid_next_time(task, "thing", "c")
    assert avoided(task, "thing") == {"a", "c"} and avoided(task, "proxy") == {"b"}
    assert avoided(object(), "thing") == set()  # a task without an avoid list


def test_secrets_are_sealed_at_rest_and_opened_at_checkout(
    rds: redis.Redis, key_prefix: str
) -> None:
    pool = make(rds, key_prefix, 2)
    stored = rds.hgetall(pool.k_secret)
    assert len(stored) == 2 and not any(b"secret-" in v for v in stored.values())
    assert len(set(stored.values())) == 2  # a fresh IV each: equal secrets would not show
    lease = pool.take((), 10).lease
    assert lease is not None and lease.secret == "secret-0"


def test_a_secret_no_key_opens_fails_its_checkout_loudly_and_is_retired(
    rds: redis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    other = LeasePool("thing", "shop", Keyspace(key_prefix).pool("thing", "shop"), rds=rds,
                      sealer=Sealer([new_key()]))  # fmt: skip
    other.add_members([("foreign", "sealed-elsewhere")])
    rds.hset(other.k_secret, "clear", "stored-in-clear")
    rds.zadd(other.k_idle, {"clear": 1})
    pool = make(rds, key_prefix)
    why = {"clear": "stored in clear", "foreign": "sealed with key .*same CHAINCRAWL_SECRET_KEY"}
    for mid in ("clear", "foreign"):  # idle longest first
        with pytest.raises(SecretUnreadable, match=f"thing {mid} of site shop.*{why[mid]}"):
            pool.take((), 10)
        assert mid in pool.retired() and mid not in pool.members()
    assert "sealed-elsewhere" not in caplog.text and "stored-in-clear" not in caplog.text
    assert pool.counters()["retired:unreadable"] == 2
