"""Triggering chains and watching them: a live progress bar per step, then a summary."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live

import chains
from chains.runner import Progress, RunHandle
from cli.tables import run_table


def watch(
    handle: RunHandle, timeout: float | None = None, console: Console | None = None
) -> Progress:
    """Live view until complete (or timeout); returns the last progress."""
    console = console or Console()
    deadline = None if timeout is None else time.monotonic() + timeout
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            p = handle.progress()
            live.update(Group(run_table(p.as_dict())))
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
