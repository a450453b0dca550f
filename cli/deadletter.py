"""`control.sh deadletter list|replay|purge`: inspect, re-send or delete tasks that failed for good."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from base_task import queue_for
from broker.workers import TaskSets
from cli import UserError
from cli.tables import Fit, Part, ident_column
from ledger.publish import send_kid
from ledger.state import RunState
from monitor.deadletter import DeadLetterStore
from utils.redis import get_redis
from utils.wire import TaskEnvelope


def list_view(
    limit: int = 50, task: str | None = None, verbose: bool = False, run: str | None = None
) -> int:
    store = DeadLetterStore(get_redis())
    items = store.list(limit, task, run)
    console = Console()
    title = list_title(len(items), store.count(), limit, task, run)
    t = Table(title=title, title_justify="left")
    for col in ("id", "failed at", "task", "run"):
        ident_column(t, col)
    t.add_column("error", overflow="fold")
    t.add_column("params", overflow="fold")
    rows: list[tuple[Part, list[Part]]] = []
    for d in items:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.failed_at))
        error, params = f"{d.error_type}: {d.error}"[:200], str(d.params)[:120]
        t.add_row(d.id, when, d.task, d.meta.get("run", ""), error, params)
        head = f"{d.id}  {when}\n{d.task}  run {d.meta.get('run') or '-'}"
        rows.append((head, [error, f"params {params}"]))
    console.print(Fit(t, title, rows))
    if verbose:
        for d in items:
            console.rule(d.id)
            console.print(d.traceback, markup=False, highlight=False)
            if d.capture:
                console.print(capture_text(d.capture), markup=False, highlight=False)
    return len(items)


def list_title(shown: int, total: int, limit: int, task: str | None, run: str | None) -> str:
    """The list's first line: how many are shown of which run or task, beside the count of
    every dead letter (37 in all over a run's 23 read as 37 of the run)."""
    of = "".join(f" of {what} {name}" for what, name in (("run", run), ("task", task)) if name)
    if not of and shown == total:
        return f"dead letters ({total} in all)"
    cut = shown == limit and shown < total
    count = "none" if not shown else f"the newest {shown}" if cut else str(shown)
    more = "; --limit N shows more" if cut else ""
    return f"dead letters{of}: {count} ({total} in all{more})"


def capture_text(cap: dict[str, Any]) -> str:
    """Where a failed render's screenshot and DOM are (`monitor.deadletter.keep_capture`)."""
    lines = [f"page capture of {cap.get('page_url') or '?'} on host {cap.get('host', '?')}:"]
    for name, size in (cap.get("files") or {}).items():
        lines.append(f"  {Path(cap.get('dir', '')) / name}  ({size:,} bytes)")
    if cap.get("dom_cut_from"):
        lines.append(f"  (the DOM was cut from {cap['dom_cut_from']:,} bytes)")
    if cap.get("screenshot_left_out"):
        lines.append(
            f"  (a {cap['screenshot_left_out']:,}-byte screenshot was left out: too large)"
        )
    if cap.get("error"):
        lines.append(f"  (not written: {cap['error']})")
    return "\n".join(lines)


def select(
    store: DeadLetterStore,
    action: str,
    ids: list[str] | None = None,
    all_: bool = False,
    task: str | None = None,
    run: str | None = None,
) -> list[str]:
    """The dead letters an action works on: the ids given, else those the selectors pick
    (--run, --task, both, or --all). Nothing given is refused: a bare purge deletes nothing."""
    if ids:
        return list(ids)
    if not (all_ or task or run):
        raise UserError(
            f"{action} needs dead-letter ids or a selector: --run RUN_ID, --task TASK or --all"
        )
    return [d.id for d in store.list(10**9, task, run)]


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
    sets = TaskSets(r)
    n = 0
    for dl_id in select(store, "replay", ids, all_, task, run):
        d = store.get(dl_id)
        if d is None:
            print(f"{dl_id}: no such dead letter")
            continue
        # a replay starts afresh: its retries (`rbase`: those before a pause), waits, avoided leases
        meta = {
            k: v for k, v in d.meta.items() if k not in ("waits", "wait_since", "avoid", "rbase")
        }
        if meta.get("run") and state.hold(meta["run"]) == "cancelled":
            print(f"{dl_id}: not replayed, its run {meta['run']} was cancelled")
            continue
        lacking = sets.check({d.task: meta.get("queue") or queue_for(d.task)}).missing
        if lacking:  # it would only be dead-lettered again (`NotRegistered`)
            print(
                f"{dl_id}: not replayed, live worker(s) {', '.join(sorted(lacking))} do not "
                f"know task {d.task}: restart the workers so they load it"
            )
            continue
        env = TaskEnvelope(uuid.uuid4().hex, d.task, d.params, meta)
        if meta.get(
            "run"
        ):  # the run's ledger gets the message (the sweeper re-sends it if the broker loses it)
            state.reopen_failed(meta["run"], meta.get("step", ""), env.encode())
        send_kid(app, env.to_dict(), queue_for)
        store.remove(dl_id)
        n += 1
    return n


def purge(
    ids: list[str] | None = None,
    all_: bool = False,
    task: str | None = None,
    run: str | None = None,
) -> int:
    """Delete dead letters (and their page captures). Their runs keep counting them as
    failed: a purge forgets the message, it does not pretend the task succeeded."""
    store = DeadLetterStore(get_redis())
    n = 0
    for dl_id in select(store, "purge", ids, all_, task, run):
        if store.remove(dl_id):
            n += 1
        else:
            print(f"{dl_id}: no such dead letter")
    return n
