"""Progress: what a run's end says, so that "complete" is not read as "every task succeeded"."""

from __future__ import annotations

from chains.runner import Progress
from ledger.state import COUNTERS


def progress(status: str, **counts: int) -> Progress:
    totals = {k: 0 for k in COUNTERS} | counts
    return Progress(run_id="r1", chain="c", status=status, steps={}, totals=totals,
                    outstanding=0, waiting=0, created=0.0, finished=1.0)  # fmt: skip


def test_a_complete_run_with_failed_tasks_is_not_ok() -> None:
    p = progress("done", dispatched=60, succeeded=10, failed=50)
    assert p.complete and p.ended
    assert p.failed == 50 and not p.ok and p.ending == "failed"
    d = p.as_dict()
    assert (d["complete"], d["ok"], d["failed"], d["ending"]) == (True, False, 50, "failed")


def test_items_refused_by_a_sink_make_a_complete_run_not_ok() -> None:
    p = progress("done", dispatched=1, succeeded=1, items=3, stored=2, store_failed=1)
    assert p.complete and not p.ok and p.ending == "failed"


def test_every_task_succeeded() -> None:
    p = progress("done", dispatched=2, succeeded=2, items=2, stored=2)
    assert p.ok and p.ending == "ok" and p.failed == 0


def test_cancelled_and_running_runs() -> None:
    assert progress("cancelled", dispatched=2, succeeded=1, cancelled=1).ending == "cancelled"
    running = progress("running", dispatched=2, succeeded=1)
    assert running.ending is None and not running.ok
