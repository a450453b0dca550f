"""Dedup: answers and ages, batching, namespaces, collisions, persistence, the bucket invariant."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from exceptions import ConfigError
from external_interface.dedup import (
    Layout,
    MemoryDedup,
    RedisDedup,
    Seen,
    Status,
    content_fp,
    decode_bucket,
    dedups,
    make_dedup,
    marking_hook,
)
from external_interface.dedup.layout import HOUR_MAX
from utils.redis import cluster_client
from utils.registry import UnknownNameError
from utils.servers import RedisServer

NEW, UNCHANGED, CHANGED = Status.NEW, Status.UNCHANGED, Status.CHANGED
T0 = 1_700_000_000.0  # a fixed "now" (seconds since 1970)


class Clock:
    """A controllable time source."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, **kw: float) -> None:
        self.t += timedelta(**kw).total_seconds()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["redis", pytest.param("cluster", marks=pytest.mark.integration)])
def dd(
    request: pytest.FixtureRequest, rds: redis.Redis, key_prefix: str, clock: Clock
) -> Iterator[RedisDedup]:
    """The store on one Redis, and on a Redis Cluster (buckets on every master, each call on
    one slot): the same answers."""
    client: Any = rds
    if request.param == "cluster":
        client = cluster_client(request.getfixturevalue("redis_cluster").url)
    store = RedisDedup("shop:item", client, prefix=key_prefix, capacity=10_000, clock=clock)
    yield store
    store.clear()


def statuses(res: list[Seen]) -> list[Status]:
    return [r.status for r in res]


# --- the answers ----------------------------------------------------------------------------


def test_new_then_unchanged_then_changed(dd: RedisDedup) -> None:
    assert statuses(dd.check_many(["a", "b"], ["v1", "w"])) == [NEW, NEW]
    assert statuses(dd.mark_many(["a", "b"], ["v1", "w"])) == [NEW, NEW]
    assert statuses(dd.check_many(["a", "b", "c"], ["v1", "w2", "x"])) == [UNCHANGED, CHANGED, NEW]
    # no value: nothing to compare, so a seen id is UNCHANGED
    assert dd.check("a").status is UNCHANGED
    # marking CHANGED records the new content; the next look is UNCHANGED
    assert dd.mark("b", "w2").status is CHANGED
    assert dd.check("b", "w2").status is UNCHANGED
    assert dd.check("b", "w").status is CHANGED


def test_marked_without_value_then_seen_with_one_is_changed(dd: RedisDedup) -> None:
    """An id marked from a list page (no content yet) must not make its detail look stored."""
    dd.mark("p")
    assert dd.check("p", "body").status is CHANGED
    dd.mark("p", "body")
    assert dd.check("p", "body").status is UNCHANGED
    dd.mark("p")  # a later mark without value keeps the recorded content
    assert dd.check("p", "body").status is UNCHANGED


def test_values_of_any_json_shape(dd: RedisDedup) -> None:
    dd.mark_many(["i"], [{"price": 3, "stock": [1, 2]}])
    assert dd.check("i", {"stock": [1, 2], "price": 3}).status is UNCHANGED  # key order ignored
    assert dd.check("i", {"price": 4, "stock": [1, 2]}).status is CHANGED
    assert content_fp(None) == 0 and 1 <= content_fp(b"x") <= 0xFFFF


def test_check_is_read_only(dd: RedisDedup, rds: redis.Redis) -> None:
    dd.check_many([f"id{i}" for i in range(200)])
    assert dd.stats()["buckets"] == 0
    dd.mark("a", "v")
    before = {k: rds.get(k) for k in dd._scan_buckets()}
    dd.check_many(["a", "b"], ["other", "v"])
    assert {k: rds.get(k) for k in dd._scan_buckets()} == before


def test_first_seen_and_age_follow_the_clock(dd: RedisDedup, clock: Clock) -> None:
    first = dd.mark("a", "v")
    assert first.first_seen is None and first.age() is None
    hour0 = int(T0 // 3600)
    clock.advance(hours=30)
    seen = dd.check("a", "v")
    assert seen.first_seen_hour == hour0
    assert seen.first_seen is not None and seen.first_seen.timestamp() == hour0 * 3600
    assert seen.age(clock()) == timedelta(hours=30)
    # a change does not move first-seen ...
    assert dd.mark("a", "v2").first_seen_hour == hour0
    assert dd.check("a").first_seen_hour == hour0
    # ... a refresh does (the clock restarts: "re-crawl if older than X")
    assert dd.mark("a", "v2", refresh=True).first_seen_hour == hour0
    assert dd.check("a").first_seen_hour == hour0 + 30


def test_filter_new_within_and_changed(dd: RedisDedup, clock: Clock) -> None:
    dd.mark_many(["old", "recent", "moving"], ["o", "r", "m1"])
    clock.advance(days=8)
    dd.mark("recent2", "r2")
    ids = ["old", "recent2", "moving", "fresh"]
    vals = ["o", "r2", "m2", "f"]
    # "store only if changed"
    assert dd.filter_new(ids, vals) == ["moving", "fresh"]
    # "skip if seen within 7 days": old (8 days) comes back, recent2 (0 h) does not
    assert dd.filter_new(ids, vals, within=timedelta(days=7)) == ["old", "moving", "fresh"]
    assert dd.filter_new(ids, vals, within=timedelta(days=7), changed=False) == [
        "old",
        "moving",
        "fresh",
    ]
    assert dd.filter_new(ids, vals, within=timedelta(days=9), changed=False) == ["fresh"]
    # read-only: still nothing marked
    assert dd.check("fresh").status is NEW


def test_time_saturates_after_16_bits_of_hours(dd: RedisDedup, clock: Clock) -> None:
    dd.mark("a")
    epoch = dd.layout.epoch_hour
    assert epoch == int(T0 // 3600)
    clock.advance(hours=HOUR_MAX + 500)
    dd.mark("late")
    assert dd.check("late").first_seen_hour == epoch + HOUR_MAX
    clock.t = T0 - 7200  # a client clock behind the epoch clamps to hour 0
    dd.mark("early")
    assert dd.check("early").first_seen_hour == epoch


def test_duplicates_in_one_batch_are_applied_in_order(dd: RedisDedup) -> None:
    res = dd.mark_many(["d", "d", "d", "e"], ["1", "1", "2", None])
    assert statuses(res) == [NEW, UNCHANGED, CHANGED, NEW]
    assert dd.check("d", "2").status is UNCHANGED


def test_id_types(dd: RedisDedup) -> None:
    dd.mark_many([7, b"bytes", "text"])
    assert statuses(dd.check_many(["7", "bytes", b"text"])) == [UNCHANGED] * 3
    with pytest.raises(TypeError):
        dd.check_many([1.5])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        dd.check_many(["a", "b"], ["only one"])
    assert dd.check_many([]) == []


def test_namespaces_are_isolated(rds: redis.Redis, key_prefix: str, clock: Clock) -> None:
    a = RedisDedup("shop:item", rds, prefix=key_prefix, capacity=1000, clock=clock)
    b = RedisDedup("shop:review", rds, prefix=key_prefix, capacity=1000, clock=clock)
    a.mark_many(["x", "y"], ["1", "2"])
    assert statuses(b.check_many(["x", "y"], ["1", "2"])) == [NEW, NEW]
    b.mark("x", "other")
    assert a.check("x", "1").status is UNCHANGED
    b.clear()
    assert rds.exists(b.meta_key) == 0
    assert a.check("x", "1").status is UNCHANGED and b.check("x").status is NEW
    assert b.stats()["buckets"] == 0
    a.clear()


def test_decoding_client_works(redis_url: str, key_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        d = RedisDedup("s:t", client, prefix=key_prefix, capacity=1000)
        d.mark_many(["a", "b"], ["1", "2"])
        assert statuses(d.check_many(["a", "b"], ["1", "x"])) == [UNCHANGED, CHANGED]
        assert d.stats()["records"] == 2
        d.clear()
    finally:
        client.close()


# --- batching -------------------------------------------------------------------------------


def test_batch_is_one_round_trip(dd: RedisDedup, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every EVALSHA of a batch is written before the first reply is read."""
    dd.layout  # noqa: B018 - meta and script load happen once, before
    events: list[str] = []
    cls = redis.connection.Connection
    send, read = cls.send_packed_command, cls.read_response

    def spy_send(
        self: redis.connection.Connection, command: object, *a: object, **k: object
    ) -> None:
        first = command if isinstance(command, bytes) else b"".join(command)  # type: ignore[arg-type]
        events.append("send EVALSHA" if b"EVALSHA" in first[:40] else "send other")
        send(self, command, *a, **k)

    def spy_read(self: redis.connection.Connection, *a: object, **k: object) -> object:
        events.append("read")
        return read(self, *a, **k)

    monkeypatch.setattr(cls, "send_packed_command", spy_send)
    monkeypatch.setattr(cls, "read_response", spy_read)
    ids = [f"https://example.com/{i}" for i in range(3000)]
    res = dd.mark_many(ids, ids)
    monkeypatch.undo()
    sends = events.count("send EVALSHA")
    assert sends >= 2  # several calls (overlapped with our hashing) ...
    assert events == ["send EVALSHA"] * sends + ["read"] * sends  # ... in one round trip
    assert statuses(res) == [NEW] * 3000
    assert statuses(dd.check_many(ids, ids)) == [UNCHANGED] * 3000


def test_bulk_batch_and_small_calls(rds: redis.Redis, key_prefix: str) -> None:
    d = RedisDedup("s:bulk", rds, prefix=key_prefix, capacity=20_000, max_ops_per_call=500)
    ids = [f"u{i}" for i in range(20_000)]
    assert statuses(d.mark_many(ids)) == [NEW] * len(ids)  # > 4 calls' worth: grouped whole
    assert d.stats()["records"] == len(ids)
    assert statuses(d.check_many(ids[::7])) == [UNCHANGED] * len(ids[::7])
    d.clear()


def test_script_reloaded_after_flush(dd: RedisDedup, rds: redis.Redis) -> None:
    dd.mark("a")
    rds.script_flush()
    assert dd.check("a").status is UNCHANGED
    assert dd.mark("b").status is NEW
    assert dd.check("b").status is UNCHANGED


# --- layout, arithmetic, collisions ---------------------------------------------------------


def test_plan_meets_the_false_seen_target() -> None:
    lay = Layout.plan(10_000_000)
    assert (lay.buckets, lay.subs) == (9766, 94)
    assert lay.false_seen_rate(10**9) <= 1e-9  # up to 100x capacity
    assert lay.hash_bits >= math.log2(1e9 / 1e-9)  # ~59.8 bits
    # bytes per record at capacity, before Redis per-key overhead
    per_record = 9 + lay.directory_bytes() * lay.buckets / 10_000_000
    assert per_record < 9.25
    small = Layout.plan(1000)
    assert small.false_seen_rate(100_000) <= 1e-9 and small.buckets == 1
    assert Layout.plan(10**9).false_seen_rate(10**11) <= 1e-9
    with pytest.raises(ConfigError):
        Layout(buckets=1, subs=0)
    with pytest.raises(ConfigError):
        Layout(buckets=1, subs=1, fp_bits=41)


def test_layout_is_stored_and_adopted(rds: redis.Redis, key_prefix: str) -> None:
    a = RedisDedup("s:t", rds, prefix=key_prefix, capacity=5000)
    a.mark("x")
    b = RedisDedup("s:t", rds, prefix=key_prefix, capacity=10_000_000)  # differs: adopts a's
    assert b.layout == a.layout
    assert b.check("x").status is UNCHANGED
    c = RedisDedup("s:t", rds, prefix=key_prefix, layout=Layout(buckets=3, subs=3))
    with pytest.raises(ConfigError):
        c.check("x")
    a.clear()


def _colliding_pair(d: RedisDedup) -> tuple[str, str]:
    seen: dict[tuple[int, int, int], str] = {}
    for i in range(10_000):
        x = f"id{i}"
        loc = d.locate(x)
        if loc in seen:
            return seen[loc], x
        seen[loc] = x
    raise AssertionError("no collision")


def test_collision_reads_as_seen_and_shares_the_record(
    rds: redis.Redis, key_prefix: str, clock: Clock
) -> None:
    """Two ids with the same cell and fp are one record: documented, not a bug."""
    d = RedisDedup(
        "s:c", rds, prefix=key_prefix, layout=Layout(buckets=2, subs=2, fp_bits=3), clock=clock
    )
    a, b = _colliding_pair(d)
    assert a != b and d.locate(a) == d.locate(b)
    d.mark(a, "va")
    hour_a = int(clock() // 3600)
    clock.advance(hours=5)
    seen = d.check(b, "va")
    assert seen.status is UNCHANGED and seen.first_seen_hour == hour_a  # false "seen", a's age
    assert d.check(b, "vb").status is CHANGED
    d.mark(b, "vb")  # updates the shared record
    assert d.check(a, "va").status is CHANGED
    assert d.stats()["records"] == 1
    d.clear()


def test_false_seen_rate_matches_the_formula(rds: redis.Redis, key_prefix: str) -> None:
    lay = Layout(buckets=2, subs=4, fp_bits=6)  # 8 cells x 64 fps = 512 slots
    d = RedisDedup("s:fp", rds, prefix=key_prefix, layout=lay)
    n = 64
    d.mark_many([f"in{i}" for i in range(n)])
    probes = [f"out{i}" for i in range(20_000)]
    rate = sum(s.status is not NEW for s in d.check_many(probes)) / len(probes)
    distinct = d.stats()["records"]  # colliding marks merged
    assert distinct <= n
    # exact chance is distinct/512; the documented bound n/(B*S*2^f) is its union bound
    assert 0.8 * distinct / 512 < rate < 1.2 * distinct / 512
    assert rate <= 1.2 * lay.false_seen_rate(n)
    d.clear()


# --- the bucket invariant against a reference model -----------------------------------------


class Reference:
    """The semantics in plain Python, keyed by (bucket, sub-bucket, fp) like the Lua script."""

    def __init__(self, d: RedisDedup) -> None:
        self.d = d
        self.rows: dict[tuple[int, int, int], tuple[int, int]] = {}

    def apply(self, mode: int, ids: list[str], vals: list[str | None], now: int) -> list[Seen]:
        out = []
        for x, v in zip(ids, vals, strict=True):
            key, cfp = self.d.locate(x), content_fp(v)
            row = self.rows.get(key)
            if row is None:
                out.append(Seen(NEW))
                if mode:
                    self.rows[key] = (now, cfp)
                continue
            hour, scfp = row
            st = UNCHANGED if cfp in (0, scfp) else CHANGED
            out.append(Seen(st, hour))
            if mode:
                self.rows[key] = (now if mode == 2 else hour, cfp if st is CHANGED else scfp)
        return out


def check_buckets(d: RedisDedup, rds: redis.Redis, model: Reference) -> None:
    """Every bucket: sorted unique runs, consistent directory, exactly the model's records."""
    lay = d.layout
    found: dict[tuple[int, int, int], tuple[int, int]] = {}
    for b in range(lay.buckets):
        raw = cast("bytes | None", rds.get(d.bucket_key(b)))
        if raw is None:
            continue
        assert len(raw) == lay.fixed_bytes() + 9 * sum(decode_bucket(raw, lay).counts)
        bucket = decode_bucket(raw, lay)
        assert sum(bucket.counts) == len(bucket.main)
        assert bucket.coarse == [sum(bucket.counts[: 16 * j]) for j in range(len(bucket.coarse))]
        pos = 0
        for s, c in enumerate(bucket.counts):
            run = bucket.main[pos : pos + c]
            fps = [r[0] for r in run]
            assert fps == sorted(set(fps))  # sorted, unique
            found.update({(b, s, fp): (hour, cfp) for fp, hour, cfp in run})
            pos += c
        keys = [(s, fp) for s, fp, *_ in bucket.pending]
        assert keys == sorted(set(keys)) and len(keys) <= lay.pending
        subs_of_main = [s for s, c in enumerate(bucket.counts) for _ in range(c)]
        main_keys = [(s, r[0]) for s, r in zip(subs_of_main, bucket.main, strict=True)]
        for s, fp, hour, cfp, at in bucket.pending:
            assert (b, s, fp) not in found  # an id lives in main or in pending
            assert at == bisect.bisect_left(main_keys, (s, fp))  # where it goes at the merge
            found[b, s, fp] = (hour, cfp)
        tail = raw[len(raw) - 14 * (lay.pending - len(bucket.pending)) :]
        assert tail == bytes(len(tail))  # unused pending slots stay zero
    epoch = lay.epoch_hour or 0
    assert found == {k: (h - epoch, c) for k, (h, c) in model.rows.items()}


@pytest.mark.parametrize(
    "layout",
    [
        Layout(buckets=3, subs=37, fp_bits=6),  # many collisions, several coarse blocks
        Layout(buckets=2, subs=5, pending=3, fp_bits=3),  # long runs, frequent merges
        Layout(buckets=4, subs=100, pending=40, fp_bits=40),  # big pending area
        Layout(buckets=1, subs=1, pending=0, fp_bits=12),  # one sorted run, no pending
    ],
    ids=lambda lay: f"B{lay.buckets}S{lay.subs}P{lay.pending}f{lay.fp_bits}",
)
def test_sorted_invariant_after_random_batches(
    rds: redis.Redis, key_prefix: str, clock: Clock, layout: Layout
) -> None:
    d = RedisDedup("s:inv", rds, prefix=key_prefix, layout=layout, clock=clock)
    model = Reference(d)
    rnd = random.Random(f"{layout}")
    for _ in range(60):
        clock.advance(hours=rnd.randrange(3))
        ids = [f"id{rnd.randrange(500)}" for _ in range(rnd.randrange(1, 150))]
        vals = [rnd.choice([None, "a", "b", "c"]) for _ in ids]
        mode = rnd.randrange(3)
        now = int(clock() // 3600)
        want = model.apply(mode, ids, vals, now)
        got = d.check_many(ids, vals) if mode == 0 else d.mark_many(ids, vals, refresh=mode == 2)
        assert got == want
    check_buckets(d, rds, model)
    assert d.stats()["records"] == len(model.rows)
    d.clear()


def test_memory_twin_gives_the_same_answers(
    rds: redis.Redis, key_prefix: str, clock: Clock
) -> None:
    r = RedisDedup("s:twin", rds, prefix=key_prefix, capacity=2000, clock=clock)
    m = MemoryDedup("s:twin", clock=clock)
    rnd = random.Random(7)
    for _ in range(30):
        clock.advance(hours=rnd.randrange(5))
        ids = [rnd.randrange(300) for _ in range(rnd.randrange(1, 60))]
        vals = [rnd.choice([None, "x", "y"]) for _ in ids]
        if rnd.random() < 0.4:
            assert r.check_many(ids, vals) == m.check_many(ids, vals)
        else:
            refresh = rnd.random() < 0.3
            assert r.mark_many(ids, vals, refresh=refresh) == m.mark_many(
                ids, vals, refresh=refresh
            )
        w = timedelta(hours=rnd.randrange(1, 20))
        assert r.filter_new(ids, vals, within=w) == m.filter_new(ids, vals, within=w)
    r.clear()


# --- memory, persistence, registry ----------------------------------------------------------


def test_under_ten_bytes_per_record(rds: redis.Redis, key_prefix: str) -> None:
    n = 60_000
    d = RedisDedup("s:mem", rds, prefix=key_prefix, capacity=n)
    ids = [f"https://shop.example.com/item/{i}" for i in range(n)]
    d.mark_many(ids, ids)
    keys = d._scan_buckets()
    assert len(keys) == d.layout.buckets
    used = sum(cast(int, rds.memory_usage(k)) for k in keys)  # value + key + dict entry, per key
    assert used / n < 10
    d.clear()


def test_survives_a_restart_from_the_aof(tmp_path: Path, clock: Clock) -> None:
    server = RedisServer(tmp_path / "aof", appendonly=True)
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        d = RedisDedup("s:p", client, prefix="p", capacity=1000, clock=clock)
        d.mark_many([f"i{i}" for i in range(500)], ["v"] * 500)
        d.mark("i1", "changed")  # an in-place SETRANGE update
        client.close()
        server.stop()
        server.start()
        client = redis.Redis.from_url(server.url)
        d2 = RedisDedup("s:p", client, prefix="p", capacity=999_999, clock=clock)
        assert d2.layout == d.layout
        res = d2.check_many(["i0", "i1", "i499", "nope"], ["v", "changed", "v", None])
        assert statuses(res) == [UNCHANGED, UNCHANGED, UNCHANGED, NEW]
        assert res[0].first_seen_hour == int(T0 // 3600)
        client.close()
    finally:
        server.stop()


def test_registry_and_factory(rds: redis.Redis, key_prefix: str) -> None:
    assert set(dedups.names()) >= {"redis", "memory"}
    mem = make_dedup("shop", "item", impl="memory", capacity=10)
    assert isinstance(mem, MemoryDedup) and mem.namespace == "shop:item"
    assert mem.mark_many(["a"]) == [Seen(NEW)]
    red = make_dedup("shop", "item", client=rds, prefix=key_prefix, capacity=100)
    assert isinstance(red, RedisDedup) and red.meta_key == f"{key_prefix}:dedup:shop:item:meta"
    with pytest.raises(UnknownNameError, match="did you mean 'redis'"):
        make_dedup("shop", "item", impl="rediss")


def test_marking_hook_marks_after_store(rds: redis.Redis, key_prefix: str) -> None:
    stores: dict[str, RedisDedup] = {}

    def store_for(item_type: str) -> RedisDedup:
        return stores.setdefault(item_type, RedisDedup(item_type, rds, prefix=key_prefix))

    hook = marking_hook(lambda it: it["id"], lambda it: it["body"], store_for=store_for)
    items = [{"id": 1, "body": "a"}, {"id": 2, "body": "b"}]
    hook("demo.post", items)
    hook("demo.post", items)  # at-least-once delivery: harmless
    d = stores["demo.post"]
    assert statuses(d.check_many([1, 2, 3], ["a", "x", None])) == [UNCHANGED, CHANGED, NEW]
    d.clear()


def test_merge_applies_updates_and_inserts_of_one_call(
    rds: redis.Redis, key_prefix: str, clock: Clock
) -> None:
    """One call that updates main and pending records and overflows pending (a rebuild)."""
    lay = Layout(buckets=1, subs=3, pending=4)
    d = RedisDedup("s:merge", rds, prefix=key_prefix, layout=lay, clock=clock)
    model = Reference(d)
    now = int(clock() // 3600)
    first = [f"m{i}" for i in range(9)]  # 4 + 4 pending, merged, then 1 pending
    model.apply(1, first, ["v"] * 9, now)
    d.mark_many(first[:4], ["v"] * 4)
    d.mark_many(first[4:8], ["v"] * 4)
    d.mark_many(first[8:], ["v"])
    bucket = decode_bucket(cast(bytes, rds.get(d.bucket_key(0))), lay)
    assert (len(bucket.main), len(bucket.pending)) == (8, 1)
    clock.advance(hours=2)
    ids = ["m0", "m8", "n1", "n2", "n3", "n4"]  # main update, pending update, 4 inserts
    vals: list[str | None] = ["w", "w", "x", "x", "x", "x"]
    want = model.apply(2, ids, vals, now + 2)
    assert d.mark_many(ids, vals, refresh=True) == want
    bucket = decode_bucket(cast(bytes, rds.get(d.bucket_key(0))), lay)
    assert (len(bucket.main), len(bucket.pending)) == (13, 0)
    check_buckets(d, rds, model)
    d.clear()
