"""Run priorities on both brokers: a more urgent run queued later is served first."""

from __future__ import annotations

import os
import time
import uuid

import pytest

import chains
from chains import Chain, step
from config import get_settings, reset_settings
from tests.scheduling.server import SchedSite

pytestmark = pytest.mark.integration

PER_RUN = 6


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest, sched_env: dict[str, str]) -> str:
    """The broker URL for this test's workers; the test process is pointed at it too."""
    if request.param == "redis":
        return ""
    url = request.getfixturevalue("amqp_broker")
    os.environ["CHAINCRAWL_BROKER_URL"] = url  # sched_env restores it afterwards
    reset_settings()
    import worker

    worker.configure(get_settings())
    return url


def test_urgent_run_overtakes_queued_runs(
    broker: str, start_workers, sched_site: SchedSite
) -> None:
    """Three runs queued low, mid, high (in that order) before any worker exists; one worker
    with one slot and prefetch 1 then serves them high, mid, low."""
    tag = uuid.uuid4().hex[:8]
    ping = Chain("prio", step("sched.local.ping"))
    runs = {}
    for name, prio in (("low", 1), ("mid", 5), ("high", 9)):
        seeds = [{"tag": f"{tag}-{name}", "n": i} for i in range(PER_RUN)]
        runs[name] = chains.run(ping, seeds, priority=prio)
    time.sleep(0.2)  # let the broker settle the messages before anyone consumes
    start_workers(
        1, concurrency=1, CHAINCRAWL_BROKER_URL=broker, CHAINCRAWL_PREFETCH_MULTIPLIER="1"
    )
    deadline = time.monotonic() + 30
    while not all(r.progress().status == "done" for r in runs.values()):
        assert time.monotonic() < deadline, {n: r.progress().totals for n, r in runs.items()}
        time.sleep(0.1)
    hits = sorted((h for h in sched_site.hits if h.tag.startswith(tag)), key=lambda h: h.t)
    order = [h.tag.rsplit("-", 1)[1] for h in hits]
    print(f"\n{broker.split('@')[-1] or 'redis'}: served {' '.join(order)}")
    assert order == ["high"] * PER_RUN + ["mid"] * PER_RUN + ["low"] * PER_RUN
    # within one priority the queue stays first in, first out
    assert [h.n for h in hits[:PER_RUN]] == list(range(PER_RUN))


FAN = 80  # the low run's children: 4 messages of 20 on a gevent worker (`Publisher.plan`)
SLOTS = 4


def test_urgent_page_overtakes_the_batches_a_gevent_worker_holds(
    start_workers, sched_site: SchedSite
) -> None:
    """A gevent worker with 4 slots reserves a priority-1 run's 80 pages in 4 batches of 20,
    which wait together for its page slots. A priority-9 run started then gets the first
    message slot that frees (when the first batch ends) and, at the page slots, goes before
    the ~56 low pages still waiting there instead of after them."""
    tag = uuid.uuid4().hex[:8]
    w = start_workers(1, pool="gevent", concurrency=SLOTS, CHAINCRAWL_TASK_LOG="1")[0]
    fan = Chain("prio_fan", step("sched.local.fan").then(
        step("sched.local.slow", tag="tag", n="n", const={"s": 0.1})))  # fmt: skip
    low = chains.run(fan, [{"tag": f"{tag}-low", "count": FAN}], priority=1)
    deadline = time.monotonic() + 30
    while len(sched_site.tagged(f"{tag}-low")) < SLOTS:  # the batches are running
        assert time.monotonic() < deadline, low.progress().totals
        time.sleep(0.01)
    high = chains.run(Chain("prio_one", step("sched.local.slow")),
                      [{"tag": f"{tag}-high", "s": 0.1}], priority=9)  # fmt: skip
    for r in (low, high):
        p = r.wait(timeout=30)
        assert p.complete and p.totals["failed"] == 0, p.totals
    lows = sched_site.tagged(f"{tag}-low")
    (urgent,) = sched_site.tagged(f"{tag}-high")
    assert len(lows) == FAN
    log = w.log.read_text(errors="replace")
    assert log.count("chaincrawl.batch[") >= 4, log[-3000:]  # the low pages came in batches
    before = sum(h.t < urgent.t for h in lows)
    print(f"\nlow pages fetched before the urgent one: {before} of {FAN}")
    # Measured 27: the first batch's 20 (the urgent message waits for that batch's message
    # slot), the round of 4 that had started by the time it arrived, and 3 that started with
    # it (their batch had begun them already; the urgent page still had its own begin to do).
    # First come, first served at the page slots: 80, all of them.
    assert before <= FAN // 2, before


def test_urgent_page_overtakes_pages_waiting_for_a_fetch_slot(
    start_workers, sched_site: SchedSite
) -> None:
    """A gevent worker with 8 page slots but 1 fetch slot (`CHAINCRAWL_FETCH_SLOTS`): 8 of a
    priority-1 run's pages hold the page slots and queue for the one fetch slot. A priority-9
    page, once it has a page slot, goes to the fetch slot before the 7 already queued there
    (the request carries the run's priority: `FetchRequest.rank`)."""
    tag = uuid.uuid4().hex[:8]
    start_workers(1, pool="gevent", concurrency=8, CHAINCRAWL_FETCH_SLOTS="1")
    fan = Chain("prio_fan", step("sched.local.fan").then(
        step("sched.local.slow", tag="tag", n="n", const={"s": 0.1})))  # fmt: skip
    low = chains.run(fan, [{"tag": f"{tag}-low", "count": 40}], priority=1)
    deadline = time.monotonic() + 30
    while len(sched_site.tagged(f"{tag}-low")) < 3:  # the page slots are full by now
        assert time.monotonic() < deadline, low.progress().totals
        time.sleep(0.01)
    high = chains.run(Chain("prio_one", step("sched.local.slow")),
                      [{"tag": f"{tag}-high", "s": 0.1}], priority=9)  # fmt: skip
    started = time.monotonic()  # the site's clock
    for r in (low, high):
        p = r.wait(timeout=30)
        assert p.complete and p.totals["failed"] == 0, p.totals
    lows = sched_site.tagged(f"{tag}-low")
    (urgent,) = sched_site.tagged(f"{tag}-high")
    ahead = sum(started <= h.t < urgent.t for h in lows)
    print(f"\nlow pages fetched after the urgent run started and before its page: {ahead}")
    # Measured 1 (the page that freed a page slot for it; its run's begin takes a moment).
    # First come, first served at the fetch slot it waited behind the pages queued there:
    # measured 7.
    assert ahead <= 3, ahead
