"""At 80 columns (a pipe's width for rich) every table keeps its identifiers whole: run ids,
task names, step ids, worker and queue names; the other columns wrap instead."""

from __future__ import annotations

import io
import time
from typing import Any

from rich.console import Console

from cli import status
from cli.tables import recent_table, run_table

RID = "0123456789abcdef"
TASKS = ("verylongsitename.platform.user_followers_listing",
         "verylongsitename.platform.user_detail_with_reviews")  # fmt: skip


def render(obj: Any, width: int = 80) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(obj)
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= width
    return out


def counters(**kw: int) -> dict[str, int]:
    base = {"dispatched": 12345, "succeeded": 12000, "failed": 345, "retried": 1000,
            "items": 99999, "stored": 99999, "store_failed": 0, "cancelled": 0}  # fmt: skip
    return base | kw


def progress() -> dict[str, Any]:
    return {"run_id": RID, "chain": "a_chain_with_a_long_name", "status": "done", "failed": 345,
            "elapsed": 12.5, "outstanding": 0, "waiting": 0, "totals": counters(),
            "steps": {"followers_step": {"task": TASKS[0], **counters()},
                      "detail_step": {"task": TASKS[1], **counters()}}}  # fmt: skip


def test_run_table_keeps_run_id_steps_and_task_names() -> None:
    out = render(run_table(progress()))
    for ident in (RID, *TASKS, "followers_step", "detail_step"):
        assert ident in out
    assert "done with 345 failed task(s)" in out


def test_recent_runs_keep_run_ids() -> None:
    recs: list[dict[str, Any]] = [{"run_id": f"{i:x}" * 16, "chain": "a_chain_with_a_long_name", "status": "done",
             "created": time.time(), "elapsed": 100.0, "totals": counters(),
             "reason": "cancelled by the operator because the site was down"}
            for i in range(10, 13)]  # fmt: skip
    out = render(recent_table(recs))
    for r in recs:
        assert r["run_id"] in out


def test_status_keeps_task_worker_and_queue_names() -> None:
    task = {"succeeded": 123456, "failed": 1234, "fail_rate": 0.01, "retried": 5000,
            "retry_rate": 0.04, "latency_p95": 1.5,
            "errors": {"x": {"NotFound": 1000, "ServerError": 234, "FetchTimeout": 3}}}  # fmt: skip
    snap = {"time": time.time(), "alerts": [], "queues": {"verylongsitename": 12, "resources": 0},
            "workers": {"worker-cli1@a-rather-long-hostname.example": {"active": 3, "tasks": [
                {"name": TASKS[0]}, {"name": TASKS[1]}]}},
            "active_runs": [progress()], "tasks": {TASKS[0]: task, TASKS[1]: task},
            "pools": [], "dead_letters": 3, "outbox": {}}  # fmt: skip
    out = render(status.render(snap, recent={TASKS[0]: {"fail_rate": 0.5}}))
    for ident in (*TASKS, "worker-cli1@a-rather-long-hostname.example", "verylongsitename", RID):
        assert out.count(ident) >= (3 if ident in TASKS else 1), ident  # workers, runs, tasks


def test_run_table_shows_a_progress_bar_per_step_at_80_columns() -> None:
    """The table needs ~160 columns; at 80 the rows become lines, and keep their bars."""
    r = progress()
    r["steps"]["detail_step"] |= {"dispatched": 100, "succeeded": 50, "failed": 0}
    out = render(run_table(r), width=80)
    assert "┏" not in out  # the lines form, not the table
    bars = [line for line in out.splitlines() if "━" in line]
    assert len(bars) == 2, out
    half = bars[1].strip()
    assert 10 <= len(half) <= 40 and half.startswith("━")
