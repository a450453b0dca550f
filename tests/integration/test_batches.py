"""Several pages per message (`chaincrawl.batch`) with real workers: every entry keeps its own
task id, commit, retry and dead letter, and the run's counts stay exact. Batching is forced
from the first child (CHAINCRAWL_BATCH_BACKLOG=1) with small batches."""

from __future__ import annotations

import re
import time

import pytest

import chains
from monitor.deadletter import DeadLetterStore
from tests.integration.test_chain_runs import expect_deep
from tests.testsite import chains as tchains
from tests.testsite.server import PER_PAGE
from utils.redis import get_redis

pytestmark = pytest.mark.integration

BATCHED = {"CHAINCRAWL_BATCH": "3", "CHAINCRAWL_BATCH_BACKLOG": "1", "CHAINCRAWL_TASK_LOG": "1"}


def batches_done(log: str) -> list[tuple[float, int]]:
    """(seconds, entries) of every batch message the worker finished (its 'succeeded' lines)."""
    pattern = r"chaincrawl\.batch\[\w+\] succeeded in ([\d.]+)s: '(\d+) pages'"
    return [(float(t), int(n)) for t, n in re.findall(pattern, log)]


def log_with_batches(w, n: int, wait: float = 10.0) -> str:
    """The worker's log once it holds `n` batches' 'succeeded' lines (or `wait` s on): a run
    is complete at its batch's commit, and Celery writes the line after the batch's ack."""
    deadline = time.monotonic() + wait
    while True:
        log = w.log.read_text(errors="replace")
        if len(batches_done(log)) >= n or time.monotonic() > deadline:
            return log
        time.sleep(0.05)


def batches_run(log: str) -> list[int]:
    """Entries of every batch message the worker finished."""
    return [n for _, n in batches_done(log)]


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_batched_run_is_exact(start_worker, pool) -> None:
    w = start_worker(pool=pool, concurrency=4, **BATCHED)
    run = chains.run(tchains.deep(), seeds=[{"page": 1}])
    p = run.wait(timeout=90)
    assert p.complete
    expect_deep(p)
    sizes = batches_run(w.log.read_text(errors="replace"))
    assert sizes and max(sizes) <= 3 and min(sizes) >= 2


def test_batch_entries_retry_and_dead_letter_one_by_one(start_worker, test_site) -> None:
    w = start_worker(**BATCHED)
    run = chains.run(tchains.probe("/status/500?e={entry_id}"), seeds=[{}])
    p = run.wait(timeout=60)
    probe = p.steps["local.probe"]
    assert probe["failed"] == PER_PAGE and probe["succeeded"] == 0
    assert probe["retried"] == 2 * PER_PAGE  # each entry its own 2 retries
    dls = [d for d in DeadLetterStore(get_redis()).list(1000) if d.meta.get("run") == run.run_id]
    assert len({d.id for d in dls}) == PER_PAGE  # one dead letter per entry, under its own id
    log = w.log.read_text(errors="replace")
    assert batches_run(log)
    for d in dls:  # each retry went out alone, under the entry's id
        assert log.count(f"testsite.local.probe[{d.id}] received") == 2


def test_flaky_entries_succeed_after_their_own_retries(start_worker, test_site) -> None:
    start_worker(**BATCHED)
    run = chains.run(tchains.probe("/flaky/{entry_id}-b?fails=1"), seeds=[{}])
    p = run.wait(timeout=60)
    probe = p.steps["local.probe"]
    assert probe["succeeded"] == PER_PAGE and probe["retried"] == PER_PAGE
    assert all(test_site.hits[f"flaky:e1-{i}-b"] == 2 for i in range(PER_PAGE))


def test_a_slow_batch_hands_its_remaining_pages_to_new_messages(start_worker, test_site) -> None:
    """Four 0.8 s pages in one message, a 1.5 s budget (a quarter of the tests' 6 s visibility
    timeout): the batch runs two, re-queues the other two instead of running on towards the
    visibility timeout, and every page is still fetched once and counted once."""
    w = start_worker(concurrency=1, **{**BATCHED, "CHAINCRAWL_BATCH": "20"})
    run = chains.run(tchains.probe("/flaky/{entry_id}-slow?fails=0&delay=0.8"), seeds=[{}])
    p = run.wait(timeout=60)
    assert p.complete
    probe = p.steps["local.probe"]
    assert probe["succeeded"] == PER_PAGE and probe["failed"] == 0 and probe["retried"] == 0
    assert all(test_site.hits[f"flaky:e1-{i}-slow"] == 1 for i in range(PER_PAGE))
    log = w.log.read_text(errors="replace")
    assert re.search(r"chaincrawl\.batch over its 2s budget: 2 of 4 pages handed", log), log[-3000:]
    assert "'2 pages, 2 re-queued'" in log


@pytest.mark.parametrize("slots", [4, 2])
def test_gevent_runs_a_batchs_pages_side_by_side_within_the_workers_slots(
    start_worker, test_site, slots: int
) -> None:
    """Four 1.5 s pages in one message on a gevent worker: they run together (1.5 s, not
    6 s one after the other), but never more of them at once than the worker's slots."""
    test_site.max_in_flight = 0  # the site lives for the whole session
    w = start_worker(pool="gevent", concurrency=slots,  # a batch budget (15 s) past 2 rounds
                     **{**BATCHED, "CHAINCRAWL_BATCH": "4", "CHAINCRAWL_VISIBILITY_TIMEOUT": "60"})  # fmt: skip
    key = f"side{slots}"
    run = chains.run(tchains.probe(f"/flaky/{{entry_id}}-{key}?fails=0&delay=1.5"), seeds=[{}])
    p = run.wait(timeout=60)
    assert p.complete
    probe = p.steps["local.probe"]
    assert probe["succeeded"] == PER_PAGE and probe["failed"] == 0
    assert all(test_site.hits[f"flaky:e1-{i}-{key}"] == 1 for i in range(PER_PAGE))
    log = log_with_batches(w, 1)
    took = [t for t, n in batches_done(log) if n == 4]
    assert len(took) == 1, log[-3000:]
    rounds = PER_PAGE // slots  # 1.5 s each; one round more would be 1.5 s more
    assert 1.5 * rounds <= took[0] < 1.5 * rounds + 1.5
    assert test_site.max_in_flight == slots


@pytest.mark.parametrize(("pool", "sizes"), [("gevent", [2, 2, 3, 3]), ("threads", [])])
def test_gevent_sends_a_small_fan_out_in_a_few_messages(
    start_worker, test_site, pool: str, sizes: list[int]
) -> None:
    """Automatic batching, a run just started (backlog 10 for 16 slots): a gevent worker
    sends a listing's 10 children in 4 messages (its batches run their pages side by side),
    a threads worker one per message (its batches would run them one after the other)."""
    w = start_worker(pool=pool, concurrency=16, CHAINCRAWL_TASK_LOG="1")
    key = f"fan-{pool}"
    run = chains.run(tchains.probe(f"/flaky/{{entry_id}}-{key}?fails=0"), seeds=[{"per": 10}])
    p = run.wait(timeout=60)
    assert p.complete
    probe = p.steps["local.probe"]
    assert probe["succeeded"] == 10 and probe["failed"] == 0 and probe["retried"] == 0
    assert all(test_site.hits[f"flaky:e1-{i}-{key}"] == 1 for i in range(10))
    log = log_with_batches(w, len(sizes)) if sizes else w.log.read_text(errors="replace")
    assert sorted(batches_run(log)) == sizes, log[-3000:]
