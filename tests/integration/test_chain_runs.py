"""Chain runs end to end: real workers, a real Redis, a real HTTP site."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

import chains
from config import ROOT, get_settings
from exceptions import ChainCrawlError
from ledger.state import RunState
from monitor.deadletter import DeadLetterStore
from monitor.status import summary, task_metrics
from tests.testsite import chains as tchains
from tests.testsite.server import PAGES, PER_PAGE, REVIEW_PAGES, REVIEWS_PER_PAGE
from utils.redis import get_redis

pytestmark = pytest.mark.integration

ENTRIES = PAGES * PER_PAGE


def expect_deep(p: chains.runner.Progress) -> None:
    s = p.steps
    assert s["local.listing"]["dispatched"] == PAGES
    assert s["local.listing"]["succeeded"] == PAGES
    assert s["local.listing"]["items"] == ENTRIES
    assert s["local.detail"]["dispatched"] == ENTRIES
    assert s["local.detail"]["items"] == ENTRIES
    assert s["local.reviews"]["dispatched"] == ENTRIES * REVIEW_PAGES
    assert s["local.reviews"]["succeeded"] == ENTRIES * REVIEW_PAGES
    assert s["local.reviews"]["items"] == ENTRIES * REVIEW_PAGES * REVIEWS_PER_PAGE
    total_tasks = PAGES + ENTRIES + ENTRIES * REVIEW_PAGES
    assert p.totals["dispatched"] == total_tasks
    assert p.totals["succeeded"] == total_tasks
    assert p.totals["failed"] == 0
    assert p.outstanding == 0
    assert (
        p.totals["stored"] == p.totals["items"] == ENTRIES * (2 + REVIEW_PAGES * REVIEWS_PER_PAGE)
    )


@pytest.mark.parametrize("pool", ["threads", "prefork", "gevent"])
def test_three_step_chain_with_fanout_and_pagination(start_worker, pool) -> None:
    start_worker(pool=pool, concurrency=4)
    run = chains.run(tchains.deep(), seeds=[{"page": 1}])
    p = run.wait(timeout=90)
    assert p.complete
    expect_deep(p)


def test_retryable_error_is_retried_then_succeeds(start_worker, test_site) -> None:
    start_worker()
    run = chains.run(tchains.probe("/flaky/{entry_id}?fails=2"), seeds=[{}])
    p = run.wait(timeout=60)
    probe = p.steps["local.probe"]
    assert probe["dispatched"] == PER_PAGE
    assert probe["succeeded"] == PER_PAGE
    assert probe["retried"] == 2 * PER_PAGE
    assert probe["failed"] == 0
    for i in range(PER_PAGE):
        assert test_site.hits[f"flaky:e1-{i}"] == 3


def test_always_failing_step_is_dead_lettered_and_run_completes(start_worker, test_site) -> None:
    start_worker()
    run = chains.run(tchains.probe("/status/500?e={entry_id}"), seeds=[{}])
    p = run.wait(timeout=60)
    probe = p.steps["local.probe"]
    assert probe["failed"] == PER_PAGE and probe["succeeded"] == 0
    assert probe["retried"] == 2 * PER_PAGE  # the probe endpoint allows 2 retries
    assert p.totals["failed"] == PER_PAGE and p.status == "done"
    dls = DeadLetterStore(get_redis()).list(1000, run=run.run_id)
    assert len(dls) == PER_PAGE and all(d.meta["run"] == run.run_id for d in dls)
    assert {d.error_type for d in dls} == {"ServerError"}
    assert all(d.params["path"].startswith("/status/500") and d.traceback for d in dls)


def test_not_found_fails_at_once_without_retries(start_worker) -> None:
    start_worker()
    run = chains.run(tchains.probe("/status/404?e={entry_id}"), seeds=[{}])
    p = run.wait(timeout=60)
    assert p.steps["local.probe"]["failed"] == PER_PAGE
    assert p.steps["local.probe"]["retried"] == 0


def test_replay_of_dead_letters_reopens_the_run(start_worker, test_site) -> None:
    from cli.deadletter import replay

    start_worker()
    run = chains.run(tchains.probe("/flaky/{entry_id}-replay?fails=5"), seeds=[{}])
    p = run.wait(timeout=60)
    assert p.steps["local.probe"]["failed"] == PER_PAGE
    # only this run's (earlier tests of the module left dead letters of their own runs)
    assert (
        replay(all_=True, run=run.run_id) == PER_PAGE
    )  # the 4th..6th attempts: fails=5 lets the 6th through
    p = run.wait(timeout=60)
    assert p.steps["local.probe"]["failed"] == 0
    assert p.steps["local.probe"]["succeeded"] == PER_PAGE


def test_worker_killed_mid_run_loses_no_task(start_worker) -> None:
    w1 = start_worker(concurrency=8)
    run = chains.run(tchains.three_step(delay=0.4), seeds=[{"page": 1}])
    state = RunState(get_redis(), get_settings())
    deadline = time.monotonic() + 30
    while state.counters(run.run_id).get("succeeded", 0) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    w1.kill()  # SIGKILL: tasks in flight are neither finished nor acknowledged
    assert run.progress().status == "running"
    start_worker(concurrency=8)
    p = run.wait(timeout=120)
    s = p.steps
    assert s["local.listing"]["succeeded"] == PAGES
    assert s["local.detail"]["succeeded"] == ENTRIES
    assert s["local.reviews"]["succeeded"] == ENTRIES * REVIEW_PAGES
    assert p.totals["failed"] == 0
    assert p.totals["stored"] == p.totals["items"]


def test_bad_seed_is_rejected_at_trigger_time(cc_env) -> None:
    with pytest.raises(ChainCrawlError) as ei:
        chains.run(tchains.deep(), seeds=[{"page": "not-a-number"}])
    assert "page" in str(ei.value) and "seed 0" in str(ei.value)


def test_backpressure_caps_a_runs_tasks_in_the_broker(start_worker, cc_env) -> None:
    from cli.status import queue_depths

    start_worker(concurrency=4)
    cap = 3
    run = chains.run(tchains.three_step(delay=0.05), seeds=[{"page": 1}], max_in_flight=cap)
    state = RunState(get_redis(), get_settings())
    peak_inflight = peak_queued = peak_waiting = 0
    while not run.progress().complete:
        c = state.counters(run.run_id)
        peak_inflight = max(peak_inflight, c.get("inflight", 0))
        peak_queued = max(peak_queued, queue_depths(get_settings(), ["testsite"])["testsite"])
        peak_waiting = max(peak_waiting, state.waiting(run.run_id))
        time.sleep(0.01)
    p = run.wait(timeout=5)
    assert peak_inflight <= cap and peak_queued <= cap
    assert peak_waiting > 0  # children really waited in Redis
    assert p.totals["succeeded"] == PAGES + ENTRIES + ENTRIES * REVIEW_PAGES
    assert state.counters(run.run_id)["inflight"] == 0 and p.waiting == 0


def test_skip_seen_dedups_requests_across_runs(start_worker, test_site) -> None:
    start_worker()
    before = sum(v for k, v in test_site.hits.items() if k.startswith("detail:"))
    first = chains.run(tchains.skip_seen(24), seeds=[{}]).wait(timeout=60)
    assert first.steps["local.detail"]["succeeded"] == ENTRIES
    second = chains.run(tchains.skip_seen(24), seeds=[{}]).wait(timeout=60)
    assert second.steps["local.listing"]["succeeded"] == PAGES
    assert second.steps["local.detail"]["dispatched"] == 0  # all seen within 24 h
    after = sum(v for k, v in test_site.hits.items() if k.startswith("detail:"))
    assert after - before == ENTRIES
    assert second.steps["local.detail"]["skipped_seen"] == second.totals["skipped_seen"] == ENTRIES
    third = chains.run(tchains.skip_seen(0), seeds=[{}]).wait(timeout=60)
    assert third.steps["local.detail"]["dispatched"] == 0  # 0 = skip if ever seen
    assert third.steps["local.detail"]["skipped_seen"] == ENTRIES
    deadline = time.monotonic() + 10  # the endpoint's metrics count them too (within a flush)
    while time.monotonic() < deadline:
        m = summary(task_metrics(get_redis()).get("testsite.local.detail", {}))
        if m["skips"]["seen"] >= 2 * ENTRIES:
            break
        time.sleep(0.1)
    assert m["skips"]["seen"] >= 2 * ENTRIES


def test_unique_skips_are_counted_and_shown_by_runs(start_worker, cc_env) -> None:
    """The same listing twice: every detail reached twice is sent once and counted as a
    `unique` skip on its step, in the progress, `control.sh runs RID` and its JSON."""
    start_worker()
    run = chains.run(tchains.unique_details(), seeds=[{}, {}])
    p = run.wait(timeout=60)
    d = p.steps["local.detail"]
    assert d["succeeded"] == ENTRIES and d["skipped_unique"] == ENTRIES
    assert p.totals["skipped_unique"] == ENTRIES and p.totals["skipped_seen"] == 0
    assert p.skips == {"robots": 0, "seen": 0, "unique": ENTRIES}
    env = {**os.environ, "COLUMNS": "200"}
    out = subprocess.run([str(ROOT / "control.sh"), "runs", run.run_id, "--json"], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["steps"]["local.detail"]["skipped_unique"] == ENTRIES
    out = subprocess.run([str(ROOT / "control.sh"), "runs", run.run_id], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"skipped: unique {ENTRIES}" in out.stdout


def test_a_finished_run_leaves_only_its_summary_in_redis(start_worker, cc_env) -> None:
    """Once complete and stored, a run's per-task bookkeeping is gone (committed task ids,
    delivery counters, staged children): its hash and counters remain, and its progress reads
    as before."""
    start_worker(concurrency=4)
    s = get_settings()
    r = get_redis()

    def per_task() -> set[str]:
        return {k for k in r.scan_iter(match=s.key("*"))
                if b":deliv:" in k or b":kids:" in k or k.endswith(b":staged")}  # fmt: skip

    before = per_task()  # earlier tests' (a killed worker's, say)
    run = chains.run(tchains.deep(), seeds=[{"page": 1}])
    run.wait(timeout=90)
    state = RunState(r, s)
    deadline = time.monotonic() + 10
    while "compacted" not in state.info(run.run_id) and time.monotonic() < deadline:
        time.sleep(0.05)  # the drainer compacts it right after counting its last items
    assert "compacted" in state.info(run.run_id)
    left = {k.decode()[len(s.key_prefix) + 1 :] for k in r.scan_iter(match=s.key("*"))}
    assert {k for k in left if run.run_id in k} == {
        f"run:{{{run.run_id}}}",
        f"run:{{{run.run_id}}}:counters",
    }
    assert per_task() <= before
    p = run.progress()
    assert p.complete
    expect_deep(p)
