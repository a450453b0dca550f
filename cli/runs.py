"""Triggering chains and watching them (a live progress bar per step, then a summary), and
listing the runs of the last days (`control.sh runs`)."""

from __future__ import annotations

import json
import logging
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape

import chains
import sites
from broker.workers import TaskSets
from chains.runner import Progress, RunHandle
from cli import RUN_ON_LOST_SLOTS, UserError
from cli.tables import recent_table, run_table
from config import ROOT
from utils.redis import get_redis
from utils.slots import SlotsLost


class RunOnLostSlots(UserError):
    """The run `trigger` watches lives on a slot range its Redis Cluster lost: paused, not
    ended (it resumes by itself once the slots are served), so neither success nor a Redis
    that does not answer: its own exit status, the slots and nodes named."""

    exit_code = RUN_ON_LOST_SLOTS

    def __init__(self, run_id: str, lost: SlotsLost) -> None:
        super().__init__(
            f"run {run_id} is paused: {lost}; it resumes by itself once they are served "
            f"(./control.sh runs {run_id})"
        )


def watch(
    handle: RunHandle, timeout: float | None = None, console: Console | None = None
) -> Progress:
    """Live view until the run ends (or timeout); returns the last progress. It follows the
    run's events (`RunHandle.wait`), redrawn at most four times a second."""
    console = console or Console()
    try:
        with Live(console=console, refresh_per_second=4, transient=False) as live:

            def show(p: Progress) -> None:
                live.update(Group(run_table(p.as_dict())))

            try:
                return handle.wait(timeout, poll=0.25, on_progress=show)
            except TimeoutError:
                p = handle.progress()
                show(p)
                return p
    finally:
        if not console.is_terminal:  # rich ends its last frame with a newline on a terminal only
            console.line()


RUNS_LOG = logging.getLogger("chaincrawl.runs")


@contextmanager
def _unlogged(logger: logging.Logger) -> Iterator[None]:
    """`logger` off for the block: a library warning the command prints itself, in its own
    words, would otherwise be on the terminal twice (Python's last-resort handler)."""
    was, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = was


def trigger(
    name: str,
    seeds: list[dict[str, Any]] | None,
    priority: int | None,
    wait: bool,
    timeout: float | None,
    wait_for_workers: bool = False,
) -> Progress | RunHandle:
    """Start the run (refused, `QueuesUnserved`, when live workers consume none of a queue it
    needs, unless `wait_for_workers`) and, with `wait`, watch it."""
    with _unlogged(RUNS_LOG):  # its warning is the handle's note, printed once below
        handle = chains.run(name, seeds=seeds, priority=priority, wait_for_workers=wait_for_workers)
    console = Console()
    console.print(f"run id: [bold]{handle.run_id}[/bold]  chain: {name}")
    if handle.note:
        console.print(f"[yellow]warning:[/yellow] {handle.note}", soft_wrap=True)
    try:  # a warning only: whatever it meets (a file gone, an unvalidated chain, Redis gone
        stale = stale_code(name)  # since the run was sent) is not the run's
    except (OSError, LookupError, RedisError):
        stale = []
    for note in stale:
        console.print(f"[yellow]warning:[/yellow] {escape(note)}", soft_wrap=True)
    if not wait:
        return handle
    try:
        return watch(handle, timeout, console)
    except SlotsLost as exc:
        raise RunOnLostSlots(handle.run_id, exc) from None


def stale_code(chain: str) -> list[str]:
    """One line per site package of the chain changed after a live worker of this machine
    that runs its tasks loaded it: a worker runs the code as it was at its start (`parse`
    runs the files as they are now), and the edit seemed to do nothing."""
    here = socket.gethostname()
    live = [w for w in TaskSets(get_redis()).live().values() if w.host == here and w.started]
    if not live:
        return []
    packages: dict[Path, set[str]] = {}  # a site package's folder -> the chain's tasks in it
    for st in chains.get_chain(chain).root.walk():
        module = sys.modules.get(sites.get_endpoint(st.task).fn.__module__)
        top = sys.modules.get(".".join((module.__name__ if module else "").split(".")[:2]))
        if top is not None and top.__file__:
            packages.setdefault(Path(top.__file__).parent, set()).add(st.task)
    out = []
    for folder, tasks in sorted(packages.items()):
        changed = max(folder.rglob("*.py"), key=lambda f: f.stat().st_mtime, default=None)
        if changed is None:
            continue
        at = changed.stat().st_mtime
        old = sorted(w.name for w in live if w.started < at and tasks & w.tasks)
        if old:
            shown = changed.relative_to(ROOT) if changed.is_relative_to(ROOT) else changed
            out.append(
                f"{shown} changed after worker(s) {', '.join(old)} started: they run the code "
                "they loaded then (./control.sh restart loads it)"
            )
    return out


def show(
    run_id: str | None,
    limit: int,
    as_json: bool,
    chain: str | None = None,
    status: str | None = None,
) -> None:
    """`control.sh runs`: the newest runs (of a chain, in a status), or one run's steps
    (finished runs too)."""
    from config import get_settings
    from monitor import status as ms
    from utils.redis import get_redis

    console = Console()
    if run_id:
        lost = ms.lost_runs(get_redis(), [run_id], get_settings())
        if lost:  # its keys are on a slot range no node serves
            if as_json:
                print(json.dumps({"run_id": run_id, "status": "paused", "reason": lost[run_id]}))
            else:
                console.print(f"run {run_id} · paused: {lost[run_id]}")
            return
        p = chains.get_run(run_id).progress().as_dict()
        rec = ms.run_records(get_redis(), rids=[run_id])
        p["reason"] = rec[0]["reason"] if rec else ""
        if as_json:
            print(json.dumps(p, indent=2))
            return
        console.print(run_table(p))
        if p["reason"]:
            console.print(f"{p['status']}: {p['reason']}")
        return
    recs = ms.recent_runs(get_redis(), limit=limit, chain=chain, status=status)
    if as_json:
        print(json.dumps(recs, indent=2))
    elif not recs:
        console.print("no runs yet: ./control.sh trigger CHAIN")
    else:
        console.print(recent_table(recs))
