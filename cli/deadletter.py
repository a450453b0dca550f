"""`control.sh deadletter list|replay`: inspect and re-send tasks that failed for good."""

from __future__ import annotations

import time
import uuid

import orjson
from rich.console import Console
from rich.table import Table

from base_task import send_kid
from chains.state import RunState
from monitor.deadletter import DeadLetterStore
from utils.redis import get_redis


def list_view(
    limit: int = 50, task: str | None = None, verbose: bool = False, run: str | None = None
) -> int:
    store = DeadLetterStore(get_redis())
    items = store.list(limit, task, run)
    console = Console()
    t = Table(title=f"dead letters ({store.count()} in all)", title_justify="left")
    for col in ("id", "failed at", "task", "run", "error", "params"):
        t.add_column(col)
    for d in items:
        t.add_row(
            d.id, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.failed_at)), d.task,
            d.meta.get("run", ""), f"{d.error_type}: {d.error}"[:80], str(d.params)[:60],
        )  # fmt: skip
    console.print(t)
    if verbose:
        for d in items:
            console.rule(d.id)
            console.print(d.traceback, markup=False, highlight=False)
    return len(items)


def replay(
    ids: list[str] | None = None,
    all_: bool = False,
    task: str | None = None,
    run: str | None = None,
) -> int:
    """Re-send dead-lettered tasks with fresh retries; a task of a run reopens that run."""
    from worker import app

    r = get_redis()
    store = DeadLetterStore(r)
    state = RunState(r)
    targets = [d.id for d in store.list(10**9, task, run)] if all_ else list(ids or [])
    n = 0
    for dl_id in targets:
        d = store.get(dl_id)
        if d is None:
            continue
        # a replay starts afresh: its retries (`rbase`: those before a pause), waits, avoided leases
        meta = {k: v for k, v in d.meta.items()
                if k not in ("waits", "wait_since", "avoid", "rbase")}  # fmt: skip
        if meta.get("run") and state.hold(meta["run"]) == "cancelled":
            print(f"{dl_id}: not replayed, its run {meta['run']} was cancelled")
            continue
        kid = {"id": uuid.uuid4().hex, "task": d.task, "params": d.params, "meta": meta}
        if meta.get("run"):  # the run's ledger gets the message (bug 1: the sweeper re-sends)
            state.reopen_failed(meta["run"], meta.get("step", ""), orjson.dumps(kid))
        send_kid(app, kid)
        store.remove(dl_id)
        n += 1
    return n
