"""The fleet budget as status and the alerts see it: backlog, entitlement, and a shortage's cause."""

from __future__ import annotations

import orjson
import pytest

from chains import Chain, step
from external_interface.resources.pool import Pool
from ledger.state import RunState
from monitor import alerts
from monitor.fleet import fleet_view, site_backlog
from scheduling.shares import TASKS, FairShare, load_budget
from settings.scheduling import FleetSettings

FLEET = {
    "CHAINCRAWL_FLEET_BUDGET": "tasks=10, cookie=6",
    "CHAINCRAWL_FLEET_SHARES": "shop=1; news=1",
}


@pytest.fixture
def fleet_env(monkeypatch: pytest.MonkeyPatch):
    for k, v in FLEET.items():
        monkeypatch.setenv(k, v)
    FleetSettings.forget()
    yield
    FleetSettings.forget()


def busy(rds, mon, rid: str, task: str, n: int, done: int = 0) -> None:
    """A run whose one step has `n` tasks dispatched and `done` of them finished."""
    state = RunState(rds, mon)
    chain = Chain(f"c-{rid}", step(task))
    state.create_run(rid, chain.name, orjson.dumps(chain.to_dict()), 5)
    state.add_dispatched(rid, chain.root.id, n)
    if done:
        rds.hincrby(state.counters_key(rid), f"{chain.root.id}:succeeded", done)


def test_backlog_counts_unfinished_tasks_per_site(rds, mon) -> None:
    busy(rds, mon, "r1", "shop.web.listing", 30, done=10)
    busy(rds, mon, "r2", "shop.web.item", 5)
    busy(rds, mon, "r3", "news.web.front", 4, done=4)
    assert site_backlog(rds, mon) == {"shop": 25}


def test_a_site_starved_by_its_empty_cookie_pool_is_short_with_that_cause(
    rds, mon, fleet_env
) -> None:
    busy(rds, mon, "r1", "shop.web.listing", 40)  # a backlog of 40: entitled to all 10 places
    share = FairShare(rds, mon.key_prefix, TASKS, load_budget(), 10.0)
    for i in range(3):
        assert share.take("shop", f"t{i}", 60).ok  # only 3 run: the rest wait on cookies
    cookies = Pool("cookie", "shop", rds=rds, prefix=mon.key_prefix)
    mid = cookies.add({"cookies": {"s": "1"}})
    assert mid is not None
    cookies.retire_members([mid], "banned")  # the pool is empty now
    [news, shop] = fleet_view(rds, mon)
    assert news["shortage"] is None and news["backlog"] == 0
    assert (shop["held"], shop["backlog"], shop["entitled"], shop["runs_at"]) == (3, 40, 10, 0.3)
    assert shop["shortage"] == "the cookie pool is exhausted (0 of 0 ready)"
    ev = alerts.Evaluator(rds, alerts.parse_config({"rules": [
        {"name": "fleet_shortage", "kind": "fleet_shortage", "below": 0.5}]}), mon)  # fmt: skip
    ticked = ev.tick(force=True)
    assert ticked is not None  # forced: no lock to lose
    [t] = ticked
    assert (t.rule, t.subject, t.action) == ("fleet_shortage", "shop", "fire")
    note = alerts.history(rds, mon)[0]
    assert "shop runs at 30% of its share (3 of 10 in flight, backlog 40): the cookie pool is " \
        "exhausted" in note["summary"]  # fmt: skip


def test_a_site_using_its_share_is_not_short(rds, mon, fleet_env) -> None:
    busy(rds, mon, "r1", "shop.web.listing", 40)
    busy(rds, mon, "r2", "news.web.front", 40)
    share = FairShare(rds, mon.key_prefix, TASKS, load_budget(), 10.0)
    for site in ("shop", "news"):
        for i in range(6):
            share.take(site, f"{site}{i}", 60)
    rows = {r["site"]: r for r in fleet_view(rds, mon)}
    assert rows["shop"]["entitled"] == rows["news"]["entitled"] == 5
    # shop took 6 while news was idle; news got the 4 left, its last 2 wait for shop's 6th
    assert (rows["shop"]["held"], rows["news"]["held"], rows["news"]["waiting"]) == (6, 4, 2)
    assert rows["shop"]["shortage"] is rows["news"]["shortage"] is None  # 120 % and 80 %
