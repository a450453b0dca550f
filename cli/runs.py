"""Triggering chains and watching them: a live progress bar per step, then a summary."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

import chains
from chains.runner import Progress, RunHandle


def progress_table(p: Progress) -> Table:
    """One row per step: a bar of finished/dispatched and the counters."""
    t = Table(title=f"run {p.run_id} · {p.chain} · {p.status}", title_justify="left", expand=False)
    for col in (
        "step",
        "task",
        "progress",
        "done/sent",
        "ok",
        "failed",
        "retried",
        "items",
        "stored",
    ):
        t.add_column(col, justify="right" if col not in ("step", "task", "progress") else "left")
    for sid, c in p.steps.items():
        finished = c["succeeded"] + c["failed"] + c["cancelled"]
        total = max(c["dispatched"], 1)
        t.add_row(
            sid, p.tasks.get(sid, ""), ProgressBar(total=total, completed=finished, width=24),
            f"{finished}/{c['dispatched']}", str(c["succeeded"]), str(c["failed"]),
            str(c["retried"]), str(c["items"]), str(c["stored"]),
        )  # fmt: skip
    tt = p.totals
    skipped = f" · cancelled {tt['cancelled']}" if tt.get("cancelled") else ""
    t.caption = (
        f"outstanding {p.outstanding} · items stored {tt['stored']}/{tt['items']}{skipped} · "
        f"{p.elapsed:.1f}s"
    )
    return t


def watch(
    handle: RunHandle, timeout: float | None = None, console: Console | None = None
) -> Progress:
    """Live view until complete (or timeout); returns the last progress."""
    console = console or Console()
    deadline = None if timeout is None else time.monotonic() + timeout
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            p = handle.progress()
            live.update(Group(progress_table(p)))
            if p.ended or (deadline is not None and time.monotonic() > deadline):
                return p
            time.sleep(0.25)


def trigger(name: str, seeds: list[dict[str, Any]] | None, priority: int | None, wait: bool,
            timeout: float | None) -> Progress | RunHandle:  # fmt: skip
    handle = chains.run(name, seeds=seeds, priority=priority)
    console = Console()
    console.print(f"run id: [bold]{handle.run_id}[/bold]  chain: {name}")
    if not wait:
        return handle
    return watch(handle, timeout, console)
