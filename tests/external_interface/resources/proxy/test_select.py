"""Client-side selection with step-by-step relaxation, and the round-robin and greedy strategies."""

from __future__ import annotations

import time

import pytest

from external_interface.resources.proxy.models import Event
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.proxy.select import Rotation, Selector

NOW = 1_700_000_000.0


def put(pool: GlobalPool, pid: str, score: float, age: float, speed: float) -> None:
    """Write one member straight into the three indexes."""
    k = pool.keys
    pool.rds.zadd(k.score, {pid: score})
    pool.rds.zadd(k.checked, {pid: NOW - age})
    pool.rds.zadd(k.speed, {pid: speed})
    pool.rds.hset(k.url, pid, f"http://{pid}")


def test_strict_selection_intersects_all_three(pool: GlobalPool) -> None:
    for i in range(4):
        put(pool, f"10.0.0.{i}:80", score=8, age=10, speed=1 + i)
    put(pool, "10.0.1.1:80", score=6, age=10, speed=1)  # score must be > 6
    put(pool, "10.0.1.2:80", score=9, age=121, speed=1)  # validated too long ago
    put(pool, "10.0.1.3:80", score=9, age=10, speed=10.5)  # too slow
    sel = Selector(pool, client_pool_size=2).select(now=NOW)
    assert sel.step == 1
    assert sel.ids == [f"10.0.0.{i}:80" for i in range(4)]  # fastest first


def test_defaults_are_haipproxys(pool: GlobalPool) -> None:
    s = Selector(pool)
    assert (s.lowest_score, s.ttl_validated, s.longest_response) == (6, 120, 10)


def test_relaxes_to_fresh_and_fast_or_scored(pool: GlobalPool) -> None:
    put(pool, "a:1", score=8, age=10, speed=1)  # strict
    put(pool, "b:1", score=5, age=10, speed=2)  # fresh & fast, low score
    put(pool, "c:1", score=9, age=500, speed=30)  # scored only
    put(pool, "d:1", score=3, age=10, speed=30)  # fresh only: not yet
    put(pool, "e:1", score=3, age=500, speed=1)  # fast only: never
    sel = Selector(pool, client_pool_size=2).select(now=NOW)  # wants 4
    # step 2 gives a, b, c (3 < 4), so step 3 runs: fresh | scored adds d
    assert sel.step == 3
    assert set(sel.ids) == {"a:1", "b:1", "c:1", "d:1"}
    assert "e:1" not in sel.ids


def test_stops_relaxing_once_enough(pool: GlobalPool) -> None:
    put(pool, "a:1", score=8, age=10, speed=1)
    for i in range(3):
        put(pool, f"b:{i + 1}", score=5, age=10, speed=2)  # fresh & fast
    put(pool, "d:1", score=3, age=10, speed=30)  # fresh only
    sel = Selector(pool, client_pool_size=2).select(now=NOW)
    assert sel.step == 2
    assert set(sel.ids) == {"a:1", "b:1", "b:2", "b:3"}


def test_thresholds_are_configurable(pool: GlobalPool) -> None:
    put(pool, "a:1", score=8, age=10, speed=3)
    put(pool, "b:1", score=8, age=10, speed=1)
    sel = Selector(pool, longest_response=2, client_pool_size=0).select(now=NOW)
    assert (sel.step, sel.ids) == (1, ["b:1"])
    sel = Selector(pool, lowest_score=9, client_pool_size=0).select(now=NOW)
    assert sel.ids == []


def test_empty_pool_selects_nothing(pool: GlobalPool) -> None:
    sel = Selector(pool).select()
    assert sel.ids == [] and sel.step == 3


# --- strategies ------------------------------------------------------------------------------
@pytest.fixture
def three(pool: GlobalPool) -> list[str]:
    now = time.time()
    ids = ["10.9.0.1:80", "10.9.0.2:80", "10.9.0.3:80"]
    for i, pid in enumerate(ids):
        put(pool, pid, score=8, age=NOW - now + 1, speed=0.1 * (i + 1))
    return ids


def test_round_robin_cycles_evenly(pool: GlobalPool, three: list[str]) -> None:
    rot = Rotation(Selector(pool), "robin", length=3)
    got = [rot.get() for _ in range(7)]
    assert got == [*three, *three, three[0]]


def test_round_robin_skips_avoided_and_drops_failures(pool: GlobalPool, three: list[str]) -> None:
    a, b, c = three
    rot = Rotation(Selector(pool), "robin", length=1)
    assert rot.get(avoid={a}) == b
    rot.feedback(c, Event.DEAD)
    assert c not in rot.snapshot()
    assert [rot.get() for _ in range(3)] == [a, b, a]


def test_greedy_keeps_a_fast_proxy(pool: GlobalPool, three: list[str]) -> None:
    a, b, c = three
    rot = Rotation(Selector(pool), "greedy", length=3, fast_response=1.0)
    for _ in range(5):
        assert rot.get() == a
        rot.feedback(a, Event.SUCCESS, elapsed=0.2)
    # a slow answer sends it to the back; the next one is used greedily in turn
    rot.feedback(a, Event.SUCCESS, elapsed=3.0)
    assert rot.snapshot() == [b, c, a]
    assert rot.get() == b
    rot.feedback(b, Event.SUCCESS, elapsed=0.5)
    assert rot.get() == b
    # a failure removes it from the rotation; avoid skips without moving
    rot.feedback(b, Event.TIMEOUT, elapsed=5.0)
    assert rot.get(avoid={c}) == a
    assert rot.snapshot()[0] == c


def test_rotation_refills_when_short(pool: GlobalPool, three: list[str]) -> None:
    rot = Rotation(Selector(pool), "robin", length=3)
    assert rot.get() == three[0]
    for pid in three:
        rot.feedback(pid, Event.DEAD)
    assert rot.snapshot() == []
    assert rot.get() == three[0]  # refreshed from the pool
    assert sorted(rot.snapshot()) == sorted(three)


@pytest.mark.parametrize("strategy", ["robin", "greedy"])
def test_a_banned_proxy_stays_out_of_refills_until_its_hold_ends(
    pool: GlobalPool, three: list[str], strategy: str
) -> None:
    """The global pool still ranks a proxy this site banned as healthy (other sites may use
    it): a refill must not bring it back before the site's Retry-After, as a channel benches
    it. A proxy that died is refilled as before (the pool's score decides about it)."""
    a, b, c = three
    rot = Rotation(Selector(pool), strategy, length=3)
    rot.refresh_interval = 0.0  # refill on every short queue
    now = [1000.0]
    rot.clock = lambda: now[0]  # the bench's time is the test's, not the machine's
    assert rot.get() == a
    rot.feedback(a, Event.BANNED, hold=30)
    rot.feedback(b, Event.BANNED)  # no Retry-After: ban_ttl
    rot.feedback(c, Event.DEAD)
    assert rot.get() == c  # refilled: the dead one is back, the banned ones are not
    assert rot.snapshot() == [c]
    assert set(rot.benched()) == {a, b} and rot.benched()[b] > 3000
    now[0] += 29
    rot.refresh()
    assert sorted(rot.snapshot()) == [c] and set(rot.benched()) == {a, b}
    now[0] += 2
    rot.refresh()
    assert sorted(rot.snapshot()) == [a, c] and set(rot.benched()) == {b}


def test_unknown_strategy(pool: GlobalPool) -> None:
    with pytest.raises(ValueError, match="strategy"):
        Rotation(Selector(pool), "random")
