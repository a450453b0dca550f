"""`control.sh status`: processes, workers, queue depths, active runs, dead letters, backlog."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table

from chains.runner import get_run
from chains.state import RunState
from cli import procs
from config import Settings
from monitor.deadletter import DeadLetterStore
from utils.redis import get_redis


def queue_depths(s: Settings, queues: list[str]) -> dict[str, int]:
    """Messages waiting per queue on a Redis broker (all priority sub-lists)."""
    if not s.broker_url.startswith("redis"):
        return {}
    r = get_redis(s.broker_url)
    prefix = f"{s.key_prefix}:q:"
    out = {}
    for q in queues:
        keys = [prefix + q] + [f"{prefix}{q}:{p}" for p in range(1, 10)]
        pipe = r.pipeline(transaction=False)
        for k in keys:
            pipe.llen(k)
        out[q] = sum(pipe.execute())
    return out


def snapshot(s: Settings) -> dict[str, Any]:
    import worker

    r = get_redis()
    state = RunState(r, s)
    runs = []
    for rid in state.active_runs()[:20]:
        try:
            runs.append(get_run(rid).progress().as_dict())
        except Exception:  # a run record that expired under us
            continue
    backlog: dict[str, Any] = {}
    try:
        from external_interface.outbox import backlog as outbox_backlog

        backlog = outbox_backlog(r, s)
    except ImportError:
        backlog = {"stream_length": r.xlen(state.outbox_key) if r.exists(state.outbox_key) else 0}
    return {
        "processes": procs.running("", s),
        "queues": queue_depths(s, worker.queues()),
        "active_runs": runs,
        "dead_letters": DeadLetterStore(r, s).count(),
        "outbox": backlog,
    }


def render(snap: dict[str, Any]) -> Group:
    from chains.runner import Progress  # noqa: F401 - type of the rows below

    parts: list[Any] = []
    t = Table(title="processes", title_justify="left")
    t.add_column("name")
    t.add_column("pid", justify="right")
    for name, pid in snap["processes"].items():
        t.add_row(name, str(pid))
    parts.append(t)
    q = Table(title="queues", title_justify="left")
    q.add_column("queue")
    q.add_column("waiting", justify="right")
    for name, n in snap["queues"].items():
        q.add_row(name, str(n))
    parts.append(q)
    runs = Table(title="active runs", title_justify="left")
    for col in ("run", "chain", "outstanding", "done/sent", "failed", "items", "stored", "elapsed"):
        runs.add_column(col)
    for r in snap["active_runs"]:
        tt = r["totals"]
        runs.add_row(
            r["run_id"], r["chain"], str(r["outstanding"]),
            f"{tt['succeeded'] + tt['failed']}/{tt['dispatched']}", str(tt["failed"]),
            str(tt["items"]), str(tt["stored"]), f"{r['elapsed']:.0f}s",
        )  # fmt: skip
    parts.append(runs)
    parts.append(f"dead letters: {snap['dead_letters']}   outbox: {snap['outbox']}")
    return Group(*parts)


def show(s: Settings, as_json: bool = False) -> dict[str, Any]:
    snap = snapshot(s)
    if as_json:
        import json

        print(json.dumps(snap, indent=2, default=str))
    else:
        Console().print(render(snap))
    return snap
