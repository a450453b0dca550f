"""Sub-pools (`CHAINCRAWL_POOL_PARTS`): one site's pool split into parts on slots of their own.
Checkout, return, ban, scores and lease expiry keep their rules across the parts; a member of
the layout before sub-pools keeps working; on a cluster one site's pool keys land on several
masters. On one Redis and on a Redis Cluster (`[cluster]`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from redis.crc import key_slot

from external_interface.resources.lease import KEY_NAMES
from external_interface.resources.pool import Pool, PoolConfig
from external_interface.resources.proxy.channel import ChannelPool
from external_interface.resources.proxy.models import ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.rules import Verdict
from tests.external_interface.stores import (
    let_time_pass,
    rds_on_both_stores,  # noqa: F401 - fixture `rds`
)
from utils.keyspace import Keyspace, part_tags
from utils.redis import cluster_client

SITE = "shop"


def make(rds: Any, prefix: str, n: int = 0, parts: int = 3, **cfg: Any) -> Pool:
    pool = Pool("cookie", SITE, rds=rds, prefix=prefix, config=PoolConfig(**cfg), parts=parts)
    for i in range(n):
        pool.add({"cookies": {"session": f"secret-{i}"}}, f"c{i}")
    return pool


def spread_ids(pool: Pool, per_part: int = 1) -> list[str]:
    """Ids with `per_part` of them homed in each part."""
    out: list[str] = []
    counts = Counter[int]()
    i = 0
    while len(out) < per_part * len(pool.part_keys):
        mid = f"m{i}"
        i += 1
        if counts[pool.home(mid)] < per_part:
            counts[pool.home(mid)] += 1
            out.append(mid)
    return out


def test_part_tags_fall_in_distinct_thirds_and_the_first_is_the_site() -> None:
    for site in ("demo", "shop", "a", "x.y"):
        tags = part_tags(site, 3)
        assert tags[0] == site  # the layout before sub-pools
        thirds = {key_slot(t.encode()) * 3 // 16384 for t in tags}
        assert len(thirds) == 3
        assert part_tags(site, 1) == (site,)
    ks = Keyspace("cc")
    bases = ks.pool_parts("cookie", "demo", 3)
    assert bases[0] == ks.pool("cookie", "demo")
    assert {ks.family(f"{b}:idle") for b in bases} == {"pool:cookie"}
    channel = ks.proxy_channel_parts("demo", 3)
    assert {ks.family(f"{b}:idle") for b in channel} == {"proxy channel"}


def test_each_part_keeps_its_keys_on_one_slot_and_the_parts_on_different_ones(
    rds: Any, key_prefix: str
) -> None:
    pool = make(rds, key_prefix)
    slots = [{key_slot(k.encode()) for k in keys} for keys in pool.part_keys]
    assert all(len(s) == 1 for s in slots)
    assert len({next(iter(s)) for s in slots}) == 3
    assert len(pool.part_keys[0]) == len(KEY_NAMES)


def test_checkout_is_exclusive_across_parts_and_returns_go_to_their_part(
    rds: Any, key_prefix: str
) -> None:
    pool = make(rds, key_prefix)
    ids = spread_ids(pool, 2)
    for mid in ids:
        pool.add({"cookies": {"session": mid}}, mid)
    assert {pool.home(m) for m in ids} == {0, 1, 2}
    for mid in ids:  # each in its home part and nowhere else
        assert [rds.hexists(keys[5], mid) for keys in pool.part_keys] == [
            i == pool.home(mid) for i in range(3)
        ]
    leases = [pool.checkout().lease for _ in ids]
    assert all(leases) and sorted(x.id for x in leases if x) == sorted(ids)
    assert all(x.part == pool.home(x.id) for x in leases if x)
    co = pool.checkout()
    assert co.lease is None and co.size == 6 and co.wait is None  # every part asked
    assert sorted(pool.lent()) == sorted(ids)
    first = leases[0]
    assert first is not None
    assert pool.release(first, Verdict.OK) == ("returned", 6)
    again = pool.checkout().lease
    assert again is not None and again.id == first.id and again.uses == 1
    assert pool.uses(first.id) == 1 and pool.sizes() == (0, 6, 6)
    assert pool.stats()["checkouts"] == 7


def test_ban_and_score_act_in_the_members_part_and_a_benched_id_stays_out(
    rds: Any, key_prefix: str
) -> None:
    pool = make(rds, key_prefix, fail_penalty=2)
    ids = spread_ids(pool)
    for mid in ids:
        pool.add({"cookies": {"session": mid}}, mid)
    by_id = {}
    for _ in ids:
        co = pool.checkout()
        assert co.lease is not None
        by_id[co.lease.id] = co.lease
    bad, weak, good = ids
    assert pool.give_back(by_id[bad], "ban", reason="banned", hold=60)[0] == "retired"
    assert pool.release(by_id[weak], Verdict.FAILED)[0] == "returned"
    assert pool.release(by_id[good], Verdict.OK)[0] == "returned"
    assert pool.score(weak) == 3 and pool.score(good) == 6
    assert rds.hget(pool.key_for("score", weak), weak) is not None
    assert pool.banned() == [bad] and pool.retired() == [bad] and bad not in pool
    assert pool.key_for("ban", bad) == pool.part_keys[pool.home(bad)][8]
    assert pool.add({"cookies": {}}, bad) is None  # benched: not added again
    assert pool.stats()["bans"] == 1 and pool.stats()["size"] == 2


def test_an_expired_lease_comes_back_in_its_part(rds: Any, key_prefix: str) -> None:
    pool = make(rds, key_prefix, lease_ttl=60)
    ids = spread_ids(pool)
    for mid in ids:
        pool.add({"cookies": {"session": mid}}, mid)
    orphans = [pool.checkout().lease for _ in ids]  # their worker dies: never released
    assert all(orphans) and pool.checkout().lease is None
    let_time_pass(rds, pool, 61)
    back = pool.checkout().lease  # every part reclaims on its own next call
    assert back is not None
    assert pool.reclaim() == 2  # the other parts' expired leases
    assert pool.stats()["reclaimed"] == 3
    orphan = next(x for x in orphans if x and x.id == back.id)
    assert pool.release(orphan, Verdict.OK)[0] == "stale"  # fenced by the new lease's token
    assert pool.lent() == [back.id]


def test_avoid_prefers_other_parts_and_falls_back_only_when_every_member_is_avoided(
    rds: Any, key_prefix: str
) -> None:
    pool = make(rds, key_prefix)
    ids = spread_ids(pool)
    for mid in ids:
        pool.add({"cookies": {"session": mid}}, mid)
    for _ in range(6):  # whichever part is asked first, the one not avoided is lent
        co = pool.checkout(avoid=set(ids[:2]))
        assert co.lease is not None and co.lease.id == ids[2]
        pool.release(co.lease, Verdict.NEUTRAL)
    held = pool.checkout(avoid=set(ids[:2])).lease
    assert held is not None and held.id == ids[2]
    # the one member not avoided is lent: wait for it rather than take an avoided one
    assert pool.checkout(avoid=set(ids[:2])).lease is None
    pool.release(held, Verdict.NEUTRAL)
    co = pool.checkout(avoid=set(ids))  # every member avoided: one of them after all
    assert co.lease is not None and co.lease.id in ids


def test_members_are_lent_about_evenly_across_parts(rds: Any, key_prefix: str) -> None:
    pool = make(rds, key_prefix, 5)
    used = Counter[str]()
    for _ in range(50):
        co = pool.checkout()
        assert co.lease is not None
        used[co.lease.id] += 1
        pool.release(co.lease, Verdict.NEUTRAL)
    assert set(used) == {f"c{i}" for i in range(5)}
    assert min(used.values()) >= 5  # 10 each in one pool


def test_members_of_the_layout_before_sub_pools_keep_working(rds: Any, key_prefix: str) -> None:
    old = make(rds, key_prefix, parts=1)  # as a version without sub-pools wrote them
    ids = [f"old{i}" for i in range(4)]
    for mid in ids:
        old.add({"cookies": {"session": mid}}, mid)
    pool = make(rds, key_prefix)
    assert any(pool.home(m) != 0 for m in ids)
    assert pool.members() == set(ids) and pool.sizes()[1] == 4
    for mid in ids:  # known in the first part: not added a second time to its home part
        assert pool.add({"cookies": {}}, mid) is None
    assert pool.sizes()[1] == 4
    leases = [pool.checkout().lease for _ in ids]
    assert all(x is not None and x.part == 0 for x in leases)
    assert pool.checkout().lease is None
    for lease in leases:
        assert lease is not None
        assert pool.release(lease, Verdict.OK)[0] == "returned"
    assert all(pool.uses(m) == 1 for m in ids)
    assert pool.retire(ids[0]) and ids[0] not in pool


def test_a_channel_refill_spreads_proxies_and_never_copies_one_twice(
    rds: Any, key_prefix: str
) -> None:
    gp = GlobalPool(rds, key_prefix)
    for i in range(9):
        gp.admit(ProxyAddress.parse(f"http://10.30.0.{i}:3128"), elapsed=0.1)
    ch = ChannelPool(SITE, gp)
    assert ch.refill() == 9 and ch.refill() == 0
    assert len({ch.home(pid) for pid, _ in ch.idle()}) > 1
    leases = [ch.checkout() for _ in range(9)]
    assert all(leases) and len({x.id for x in leases if x}) == 9
    assert ch.checkout() is None
    for lease in leases:
        assert lease is not None and ch.release(lease) == "returned"
    assert sorted(u for _, u in ch.idle()) == [1] * 9


@pytest.mark.integration
def test_one_sites_pool_keys_land_on_more_than_one_master(redis_cluster: Any) -> None:
    client = cluster_client(str(redis_cluster.url))
    try:
        pool = Pool("cookie", "demo", rds=client, prefix="subpools", parts=3)  # type: ignore[arg-type]
        nodes = {client.get_node_from_key(keys[0]).name for keys in pool.part_keys}
        assert len(nodes) == 3  # three masters, one part each
        for i in range(6):
            pool.add({"cookies": {"s": str(i)}}, f"d{i}")
        holding = {
            client.get_node_from_key(keys[5]).name
            for keys in pool.part_keys
            if client.hlen(keys[5])
        }
        assert len(holding) > 1
        pool.clear()
    finally:
        client.close()
