"""The fleet budget's fair shares: parsing, the water-fill, and the script that holds them."""

from __future__ import annotations

import random
import uuid

import pytest

from exceptions import ConfigError
from external_interface.resources.lease import Lease, LeasePool, Profile, set_lease_guard
from scheduling.shares import (
    TASKS,
    FairShare,
    Fleet,
    FleetBudget,
    Share,
    allocate,
    load_budget,
    parse_budget,
    parse_shares,
)
from settings.scheduling import FleetSettings


def test_parsing_the_budget_and_the_shares(tmp_path) -> None:
    assert parse_budget("tasks=32, rate=40/s, cookie=16") == ({"tasks": 32, "cookie": 16}, 40.0)
    assert parse_shares("demo=1; news=2,priority=7") == {
        "demo": Share(1.0, 5),
        "news": Share(2.0, 7),
    }
    with pytest.raises(ConfigError, match="give tasks=N too"):
        parse_budget("rate=10/s")
    with pytest.raises(ConfigError, match="expected tasks=N"):
        parse_budget("tasks=many")
    with pytest.raises(ConfigError, match="entry 'news=0'"):
        parse_shares("news=0")
    with pytest.raises(ConfigError, match="unknown term 'colour'"):
        parse_shares("news=colour=red")
    f = tmp_path / "fleet.yaml"
    f.write_text("budget: {tasks: 8, rate: 10/s}\nshares: {a: 1, b: {weight: 3, priority: 9}}\n")
    b = load_budget(FleetSettings(budget=str(f)))
    assert b.dims == {"tasks": 8} and b.rate == 10.0
    assert b.shares == {"a": Share(1.0, 5), "b": Share(3.0, 9)} and b.nominal("b", TASKS) == 6.0
    assert not load_budget(FleetSettings(budget="")).on


def test_the_water_fill_is_work_conserving_weighted_and_prioritised() -> None:
    two = {"a": Share(), "b": Share()}
    assert allocate(8, {"a": 0, "b": 20}, two) == {"a": 0, "b": 8}  # idle share lent
    assert allocate(8, {"a": 20, "b": 20}, two) == {"a": 4, "b": 4}  # and given back
    assert allocate(8, {"a": 2, "b": 20}, two) == {"a": 2, "b": 6}  # unused part only
    weighted = {"a": Share(1), "b": Share(3)}
    assert allocate(8, {"a": 20, "b": 20}, weighted) == {"a": 2, "b": 6}
    prio = {"a": Share(1, 5), "b": Share(1, 5), "c": Share(1, 9)}
    got = allocate(9, {"a": 10, "b": 0, "c": 10}, prio)  # b's share goes to c first
    assert got == pytest.approx({"a": 3, "b": 0, "c": 6})


@pytest.fixture
def share(rds, key_prefix) -> FairShare:
    budget = FleetBudget({TASKS: 4}, None, {"a": Share(), "b": Share()})
    return FairShare(rds, key_prefix, TASKS, budget, want_ttl=5.0)


def test_an_idle_sites_share_is_lent_and_comes_back(share: FairShare) -> None:
    b_tasks = [f"b{i}" for i in range(4)]
    assert all(share.take("b", t, 30).ok for t in b_tasks)  # a idle: b has all four
    assert not share.take("b", "b4", 30).ok
    first = share.take("a", "a0", 30)  # a wakes: refused while b holds everything...
    assert not first.ok and first.share == 1.0  # ...but its share (its demand, so far) is back
    second = share.take("a", "a1", 30)
    assert not second.ok and second.share == 2.0  # up to its nominal half, as demand grows
    share.give("b", "b0")
    assert not share.take("b", "b5", 30).ok  # b is over its share now: nothing new
    assert share.take("a", "a0", 30).ok  # the freed place goes to a
    share.give("b", "b1")
    assert share.take("a", "a1", 30).ok
    assert not share.take("a", "a2", 30).ok  # a at its share of 2, b at 2
    view = share.view()
    assert (view["a"]["held"], view["b"]["held"]) == (2, 2)
    assert view["b"]["want"] >= 1  # b5 still asking: b's demand


def test_a_holder_asking_again_is_renewed_not_counted_twice(share: FairShare) -> None:
    assert share.take("a", "t1", 30).ok
    again = share.take("a", "t1", 30)
    assert again.ok and again.held == 1 and again.total == 1


def test_the_script_computes_the_python_water_fill(rds, key_prefix) -> None:
    rng = random.Random(3)
    shares = {s: Share(rng.choice([1, 2, 3]), rng.choice([3, 5, 9])) for s in "abcde"}
    fs = FairShare(rds, key_prefix, TASKS, FleetBudget({TASKS: 12}, None, shares), want_ttl=60)
    demand = {}
    for s in shares:  # some held, some waiting (refused once the fleet is full)
        demand[s] = rng.randint(0, 6)
        for i in range(demand[s]):
            fs.take(s, f"{s}{i}", 60)
    view = fs.view()
    want = {s: view[s]["held"] + view[s]["want"] for s in shares}
    assert want == demand
    expect = allocate(12, demand, shares)
    assert {s: view[s]["share"] for s in shares} == pytest.approx(expect, abs=1e-3)


def test_the_fleet_rate_follows_the_task_shares(rds, key_prefix) -> None:
    budget = FleetBudget({TASKS: 4}, 40.0, {"a": Share(), "b": Share()})
    fleet = Fleet(rds, key_prefix, budget, FleetSettings(refresh=0.0001))
    assert fleet.rate_of("a") == 20.0 and fleet.rate_of("x") is None  # nominal before anything
    for i in range(4):
        fleet.take_task("b", f"b{i}", 30)
    assert fleet.rate_of("b") == pytest.approx(40.0)  # b alone: the whole fleet rate
    fleet.take_task("a", "a0", 30)
    fleet.take_task("a", "a1", 30)
    assert fleet.rate_of("a") == pytest.approx(20.0) == fleet.rate_of("b")


def test_pool_checkouts_are_held_to_the_sites_share_of_leases(rds, key_prefix) -> None:
    budget = FleetBudget({"cookie": 2}, None, {"a": Share(), "b": Share()})
    fleet = Fleet(rds, key_prefix, budget)
    pool = LeasePool("cookie", "a", f"{key_prefix}:site:{{a}}:pool:cookie", rds=rds,
                     profile=Profile(produced=False))  # fmt: skip
    pool.add_members([(f"m{i}", "{}") for i in range(4)])
    set_lease_guard(fleet)
    try:
        leases: list[Lease] = []
        for _ in range(2):
            co = pool.take((), 30)
            assert co.lease is not None
            leases.append(co.lease)
        refused = pool.take((), 30)  # 2 members idle, but the fleet has 2 cookie leases in all
        assert refused.lease is None and refused.shared and refused.wait
        assert pool.sizes()[0] == 2  # the member went back untouched
        pool.give_back(leases[0])
        assert pool.take((), 30).lease is not None
    finally:
        set_lease_guard(None)


def test_a_site_outside_the_shares_is_not_held(rds, key_prefix) -> None:
    fleet = Fleet(rds, key_prefix, FleetBudget({TASKS: 1}, None, {"a": Share()}))
    assert all(fleet.take_task("other", uuid.uuid4().hex, 30) for _ in range(5))
    assert fleet.take_lease("cookie", "a", "h", 30) is None  # no cookie dimension
