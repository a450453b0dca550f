"""Re-crawls that follow change, end to end on real workers and a simulated clock.

The demo's change generator moves some posts' likes often and most rarely; a `by_change`
schedule entry re-crawls `demo.h5.detail` for the keys its change model says are due. The
test moves the demo's clock and the scheduler's (`CHAINCRAWL_RECRAWL_CLOCK=redis`) forward
half an hour per tick, never sleeping for time to pass: at each tick the trigger starts a run
of the due keys (the first tick through the beat task on a worker, the others in this
process), the workers fetch them, and their drainers record the visits. Every count the
history keeps is then checked against the demo's own change events.
"""

from __future__ import annotations

import itertools
import statistics
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis
import requests

import chains
from chains import Chain, step
from config import get_settings
from demo.data import BASE_TS
from demo.testing import DemoServer
from external_interface.storage.sinks.jsonl import iter_records
from monitor.status import recrawl_watches
from scheduling.periodic import TRIGGER_TASK, ScheduleEntry
from scheduling.recrawl import CLOCK_KEY, History, KeyRecord
from scheduling.tasks import entry_key, trigger, watch_of
from settings.scheduling import RecrawlSettings
from tests.conditions import wait_for
from utils.clock import SimClock
from utils.keyspace import Keyspace
from utils.redis import get_redis
from worker import app

pytestmark = pytest.mark.integration

HALF_HOUR = 1800.0
TICKS = 24  # twelve simulated hours
BUDGET = 480.0  # pages a day for 40 posts: 12 visits per post per day on average
WORKER_ENV = {
    "CHAINCRAWL_PROVIDERS": "user_agent=noop,device_id=noop,sign=noop,cookie=noop",
    "CHAINCRAWL_RECRAWL_CLOCK": "redis",
    "CHAINCRAWL_RECRAWL_REFRESH": "0.2",
}


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoServer]:
    with DemoServer(size="tiny", users=8, posts_per_user=5, comments_per_post=0, changes=True,
                    change_clock="manual", change_classes="0.25:48/d, 0.75:1/30d",
                    change_hours="0-23") as server:  # fmt: skip
        yield server


@pytest.fixture
def sim_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimClock]:
    monkeypatch.setenv("CHAINCRAWL_RECRAWL_CLOCK", "redis")
    RecrawlSettings.forget()
    clock = SimClock(get_redis(), Keyspace(get_settings().key_prefix).key(CLOCK_KEY))
    try:
        yield clock
    finally:
        monkeypatch.delenv("CHAINCRAWL_RECRAWL_CLOCK")
        RecrawlSettings.forget()


def stored_posts(run_id: str) -> list[str]:
    return [r["item"]["post_id"] for r in iter_records("demo.post") if r["run"] == run_id]


def sends_now(history: History, t: float) -> bool:
    """Whether a trigger at `t` starts a run: a key is due and the allowance holds a page.
    Which tick is the first is not fixed: each batch of the enrolling run's visits that the
    drainers record is planned at the budget shared by the keys known so far (one batch of
    40: every key due two hours on and bought then, none half an hour later; batches of 11,
    16 and 13: the first 11 due within the hour), so the test asks the history."""
    totals, budget = history.totals(), history.watch.knobs.budget
    accrued = budget * (t - totals.get("tokens_at")) / 86400
    allowance = min(budget, totals.get("tokens") + max(0.0, accrued))
    return allowance >= 1 and history.r.zcount(history.k_due, "-inf", t) > 0


def test_recrawls_follow_change_on_real_workers(
    start_worker: Any, demo: DemoServer, sim_clock: SimClock
) -> None:
    start_worker(concurrency=8, queues="demo,resources", DEMO_BASE_URL=demo.url,
                          **WORKER_ENV)  # fmt: skip
    http = requests.Session()

    def move(t: float) -> None:
        http.post(f"{demo.url}/admin/clock", json={"now": t}).raise_for_status()
        sim_clock.set(t)

    name = f"posts-{uuid.uuid4().hex[:6]}"
    entry = ScheduleEntry.model_validate({
        "name": name, "step": "demo.h5.detail", "every": "1m",
        "by_change": {"item": "demo.post", "key": "post_id", "fields": ["likes"],
                      "budget": f"{BUDGET:g}/day", "min_interval": "10m", "max_interval": "2d"},
    })  # fmt: skip
    history = History(get_redis(), get_settings().key_prefix, watch_of(entry))
    pids = [f"p{n}" for n in range(1, 41)]
    t: float = BASE_TS
    move(t)
    first = trigger(entry)  # publishes the watch; nothing is enrolled yet
    assert (first.status, first.reason) == ("skipped", "no key due")

    # one full crawl enrolls every post (any run storing demo.post items is a visit)
    enroll = chains.run(Chain("enroll", step("demo.h5.detail")), [{"post_id": p} for p in pids])
    assert enroll.wait(timeout=120).ok
    wait_for(lambda: history.totals().get("keys") == 40, 30, "40 keys enrolled")
    visits = {p: [t] for p in pids}

    on_worker = False  # the beat task on a worker started a run
    for _ in range(TICKS):
        t += HALF_HOUR
        move(t)
        if not on_worker and sends_now(history, t):  # the beat task on a worker
            r = get_redis()
            before = r.hget(entry_key(name), "last_check")
            spec = entry.model_dump(mode="json", exclude={"name"})
            app.send_task(TRIGGER_TASK, args=(name, spec), queue="resources")

            def triggered(r: redis.Redis = r, b: Any = before) -> bool:
                return r.hget(entry_key(name), "last_check") != b

            wait_for(triggered, 60, "the worker's trigger")
            outcome = cast(bytes, r.hget(entry_key(name), "last_outcome") or b"").decode()
            assert outcome.startswith("started"), outcome
            run_id, on_worker = outcome.split()[1], True
        else:
            out = trigger(entry)
            run_id = out.run_id if out.status == "started" else ""
        if not run_id:
            continue
        p = chains.get_run(run_id).wait(timeout=120)
        assert p.ok and p.totals["stored"] == p.totals["items"]
        got = stored_posts(run_id)
        assert len(got) == len(set(got)) == p.totals["items"]
        for pid in got:
            visits[pid].append(t)

    assert on_worker, "no tick had a key due for the worker's trigger"

    # every interval and change the history counts is what the demo did between two visits
    truth = {p: http.get(f"{demo.url}/admin/changes", params={"post": p}).json() for p in pids}
    for pid in pids:
        times, events = visits[pid], truth[pid]["events"]
        x = sum(1 for a, b in itertools.pairwise(times) if any(a < e <= b for e in events))
        rec = history.record(pid)
        assert rec is not None and (rec.n, rec.x) == (len(times) - 1, x), pid
    bought = sum(len(v) - 1 for v in visits.values())
    found = sum(cast(KeyRecord, history.record(p)).x for p in pids)  # each asserted above
    assert 0 < bought <= BUDGET * TICKS * HALF_HOUR / 86400  # the allowance starts empty
    assert found > 0

    # keys that change often are visited often; stable ones wait for the floor
    hot = [len(visits[p]) - 1 for p in pids if truth[p]["per_day"] >= 48]
    cold = [len(visits[p]) - 1 for p in pids if truth[p]["per_day"] < 1]
    print(f"\nvisits per post in 12 simulated hours: hot {hot}, cold {cold}; {bought} visits "
          f"bought, {found} changes found")  # fmt: skip
    assert hot and cold and statistics.mean(hot) >= 2 * max(statistics.mean(cold), 0.5)

    # status shows the site's budget, the visits it bought and the changes they found
    [row] = [w for w in recrawl_watches(get_redis()) if w["watch"] == name]
    assert (row["site"], row["budget"], row["keys"]) == ("demo", BUDGET, 40)
    assert row["last_day"]["bought"] == row["total"]["bought"] == bought
    assert row["last_day"]["found"] == found
