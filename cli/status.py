"""`control.sh status`: workers, queues, active runs with a bar per step, error rates, pools.

`--json` prints one snapshot (monitor.snapshot.snapshot) for scripts; `--watch` redraws it live.
In watch mode the broadcast to workers (which waits `--inspect-timeout` seconds for replies)
runs in a background thread, so the view keeps its refresh rate, and error rates are also
shown over the last refresh (`recent`), not only since the counters began.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from broker.app import default_app
from cli.tables import Fit, Part, ident_column, labelled, run_table
from config import Settings, get_settings
from monitor import snapshot as msnap
from monitor import status as ms


def queue_depths(s: Settings, queues: list[str]) -> dict[str, int]:
    """Messages waiting per queue on a Redis broker (kept for callers of the old module)."""
    from utils.redis import get_redis

    return ms.queue_depths(ms.broker_client(get_redis(s.redis_url), s), s, queues)


def snapshot(s: Settings, workers_timeout: float | None = 1.0) -> dict[str, Any]:
    return msnap.snapshot(s, workers_timeout=workers_timeout)


# --- rendering ---------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _secs(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.0f}ms" if x < 1 else f"{x:.2f}s"


def _rate_style(x: float | None) -> str:
    if x is None:
        return ""
    return "bold red" if x >= 0.2 else "yellow" if x >= 0.05 else "green"


def _workers_table(snap: dict[str, Any]) -> Table | Fit:
    t = Table(title="workers", title_justify="left")
    w = snap.get("workers")
    ident_column(t, "worker")
    t.add_column("active", justify="right")
    t.add_column("running now", no_wrap=True)  # task names, one a line
    procs = snap.get("processes") or {}
    started = ""
    if procs:
        started = "started here: " + ", ".join(
            f"{n} ({p})"
            if not n.startswith("worker-") or _has_child(p)
            else f"{n} ({p}, no worker process: starting it again)"
            for n, p in procs.items()
        )
    if w is None:
        t.add_row("(not inspected)" if "workers" in snap else "-", "", "")
    elif not w:
        t.add_row(Text("no worker answered", style="bold red"), "0", "")
    if not w:
        return Fit(t, "workers", [], started, below=True)
    rows: list[tuple[Part, list[Part]]] = []
    for name, info in sorted(w.items()):
        names = sorted({x["name"] or "?" for x in info["tasks"]})
        t.add_row(name, str(info["active"]), "\n".join(names))
        rows.append((name, [f"active {info['active']}", *names]))
    return Fit(t, "workers", rows, started, below=True)


def _has_child(pid: int) -> bool:
    """Whether a worker's supervisor has its worker running (Linux; elsewhere: assume so)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return bool(f.read().split())
    except OSError:
        return True


def _queues_table(snap: dict[str, Any]) -> Table:
    t = Table(title="queues", title_justify="left")
    ident_column(t, "queue")
    t.add_column("waiting", justify="right")
    for name, n in snap["queues"].items():
        t.add_row(name, Text(str(n), style="bold" if n else "dim"))
    if snap.get("unacked"):
        t.caption = f"unacked (running or reserved): {snap['unacked']}"
    return t


def _tasks_table(snap: dict[str, Any], recent: dict[str, dict[str, Any]] | None) -> Fit:
    title = "tasks (since counters began)"
    t = Table(title=title, title_justify="left")
    # waits (a throttle, a rate limit's slot, an empty pool) are not errors: a crawl whose
    # every page succeeded shows them apart, under "waits", never under "top errors"
    cols = ["ok", "failed", "fail %", "retried", "retry %", "p95", "top errors", "waits"]
    if recent is not None:
        cols.insert(3, "fail % recent")
    ident_column(t, "task")
    for col in cols:
        t.add_column(col, justify="left" if col in ("top errors", "waits") else "right")
    rows: list[tuple[Part, list[Part]]] = []
    for task, m in sorted(snap["tasks"].items()):
        errs: dict[str, int] = {}
        for outcome, breakdown in m["errors"].items():
            if outcome == "waited":
                continue
            for k, v in breakdown.items():
                errs[k] = errs.get(k, 0) + v
        waits = m["errors"].get("waited", {})
        row: list[Any] = [
            str(m["succeeded"]),
            str(m["failed"]),
            Text(_pct(m["fail_rate"]), style=_rate_style(m["fail_rate"])),
            str(m["retried"]),
            _pct(m["retry_rate"]),
            _secs(m["latency_p95"]),
            _top(errs),
            Text(_top(waits), style="dim"),
        ]
        if recent is not None:
            rr = (recent.get(task) or {}).get("fail_rate")
            row.insert(3, Text(_pct(rr), style=_rate_style(rr)))
        t.add_row(task, *row)
        rows.append((task, [labelled(c, v) for c, v in zip(cols, row, strict=True) if str(v)]))
    empty = [f"{task} {m['empty']}" for task, m in sorted(snap["tasks"].items()) if m.get("empty")]
    caption = (
        f"warning: pages that yielded nothing (no item, no follow-up): {', '.join(empty)}"
        if empty  # a selector that matches nothing ends its pages "ok" with nothing in them
        else ""
    )
    if caption:
        t.caption, t.caption_style = caption, "yellow"
    return Fit(t, title, rows, caption)


def _top(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:3])


def _pools_table(snap: dict[str, Any]) -> Table:
    t = Table(title="resource pools", title_justify="left")
    ident_column(t, "pool")
    for col in ("size", "banned", "produced", "reported"):
        t.add_column(col, justify="right")
    for p in snap["pools"]:
        size = Text(str(p["size"]), style="bold red" if p["size"] <= 0 else "")
        when = "live" if p["source"] == "live" else f"{p['age']:.0f}s ago"
        t.add_row(
            p["name"],
            size,
            str(p["bans"]),
            str(p["produced"]),
            Text(when, style="yellow" if p.get("stale") else ""),
        )
    return t


def _adaptive_table(snap: dict[str, Any]) -> Table:
    """`render="auto"` endpoints: how each URL pattern is got, and why."""
    t = Table(title="adaptive rendering", title_justify="left")
    ident_column(t, "endpoint pattern")
    for col in ("decision", "pages", "rendered %", "samples same/differ", "changes", "last sample"):
        t.add_column(col, justify="left" if col in ("decision", "last sample") else "right")
    for d in snap["adaptive"]:
        why = (d.get("evidence") or {}).get("why", "")
        t.add_row(
            f"{d['endpoint']} {d['pattern']}",
            d["decision"],
            str(d["pages"]),
            _pct(d["rendered_share"]),
            f"{d['same']}/{d['differ']}",
            str(d["changes"]),
            why,
        )
    return t


def _recrawl_table(snap: dict[str, Any]) -> Table:
    """Per site and watched set: the budget, the visits it bought and the changes they found."""
    t = Table(title="re-crawls by change (last day / all)", title_justify="left")
    ident_column(t, "site / watch")
    for col in (
        "budget/day",
        "keys",
        "visits bought",
        "changes found",
        "found/visit",
        "busy hours (UTC)",
        "interval",
    ):
        t.add_column(col, justify="right")
    for w in snap["recrawl"]:
        day, tot = w["last_day"], w["total"]
        rate = day["found"] / day["bought"] if day["bought"] else None
        hours = ",".join(str(h) for h in w["hot_hours"]) or "-"
        iv = w["mean_interval_h"]
        t.add_row(
            f"{w['site']} / {w['watch']}",
            f"{w['budget']:g}",
            str(w["keys"]),
            f"{day['bought']} / {tot['bought']}",
            f"{day['found']} / {tot['found']}",
            _pct(rate),
            hours,
            "-" if iv is None else f"{iv:g}h",
        )
    return t


def _fleet_table(snap: dict[str, Any]) -> Table:
    """Per site of the fleet budget: its share, what it uses, and why when it runs short."""
    t = Table(title="fleet budget shares", title_justify="left")
    ident_column(t, "site")
    for col in (
        "weight",
        "prio",
        "nominal",
        "share now",
        "in flight",
        "backlog",
        "runs at",
        "req/s",
    ):
        t.add_column(col, justify="right")
    t.add_column("shortage")
    for r in snap["fleet"]:
        runs_at = "-" if r["runs_at"] is None else f"{r['runs_at']:.0%}"
        t.add_row(
            r["site"],
            f"{r['weight']:g}",
            str(r["priority"]),
            f"{r['nominal']:g}",
            f"{r['share']:g}",
            str(r["held"]),
            str(r["backlog"]),
            Text(runs_at, style="bold red" if r["shortage"] else ""),
            "-" if r["rate"] is None else f"{r['rate']:.1f}",
            Text(r["shortage"] or "", style="red"),
        )
    return t


def _footer(snap: dict[str, Any]) -> Text:
    ob = snap.get("outbox") or {}
    parts = [f"dead letters: {snap['dead_letters']}", f"outbox backlog: {ob.get('length', 0)}"]
    if ob.get("oldest_entry_age"):
        parts.append(f"oldest unstored: {ob['oldest_entry_age']:.0f}s")
    if ob.get("errors"):
        parts.append(f"failing sinks: {', '.join(ob['errors'])}")
    if ob.get("dead"):
        parts.append(f"refused items: {ob['dead']}")
    if snap.get("malformed"):
        parts.append(f"malformed broker messages: {snap['malformed']} (kept in broker:malformed)")
    if snap.get("unknown_tasks"):
        parts.append(
            f"tasks refused as unknown by workers: {snap['unknown_tasks']} "
            "(restart the workers; deadletter list)"
        )
    if snap.get("dead_worker_restored"):
        parts.append(f"messages restored from dead workers: {snap['dead_worker_restored']}")
    return Text("   ".join(parts))


def render(snap: dict[str, Any], recent: dict[str, dict[str, Any]] | None = None) -> Group:
    parts: list[Any] = []
    firing = snap.get("alerts") or []
    stamp = time.strftime("%H:%M:%S", time.localtime(snap.get("time", time.time())))
    head = Text(f"chaincrawl status {stamp}   ")
    head.append(f"alerts firing: {len(firing)}", style="bold red" if firing else "green")
    parts.append(head)
    for a in firing:
        parts.append(Text(f"  ! {a['rule']} {a['subject']} (value {a.get('value')})", style="red"))
    if snap.get("lost_slots"):
        parts.append(Text(f"  ! {snap['lost_slots']}", style="bold red"))
    for b in snap.get("broken_modules") or []:
        parts.append(
            Text(
                f"  ! {b['kind']} module {b['module']} ({b['file']}:{b['line']}) "
                f"failed to import in {', '.join(b['in'])}: {b['error']}",
                style="bold red",
            )
        )
    parts.append(_workers_table(snap))
    parts.append(_queues_table(snap))
    runs = snap["active_runs"]
    if runs:
        parts.extend(
            Text(f"run {r['run_id']} · paused: {r['reason']}", style="bold yellow")
            if r.get("lost")
            else run_table(r)
            for r in runs
        )
    else:
        parts.append(Text("no active runs", style="dim"))
    if snap.get("tasks"):
        parts.append(_tasks_table(snap, recent))
    if snap.get("pools"):
        parts.append(_pools_table(snap))
    if snap.get("adaptive"):
        parts.append(_adaptive_table(snap))
    if snap.get("recrawl"):
        parts.append(_recrawl_table(snap))
    if snap.get("fleet"):
        parts.append(_fleet_table(snap))
    parts.append(_footer(snap))
    return Group(*parts)


def show(s: Settings, as_json: bool = False, workers_timeout: float | None = 1.0) -> dict[str, Any]:
    snap = snapshot(s, workers_timeout)
    if as_json:
        print(json.dumps(snap, indent=2, default=str))
    else:
        Console().print(render(snap))
    return snap


# --- watch mode ----------------------------------------------------------------------------------


def recent_rates(prev: dict[str, Any] | None, cur: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Failure rate per task between two snapshots (None where nothing finished)."""
    out: dict[str, dict[str, Any]] = {}
    for task, m in cur["tasks"].items():
        old = (prev or {}).get("tasks", {}).get(task, {})
        ok = m["succeeded"] - old.get("succeeded", 0)
        failed = m["failed"] - old.get("failed", 0)
        n = ok + failed
        out[task] = {"finished": n, "fail_rate": failed / n if n > 0 else None}
    return out


class WorkerPoller:
    """Broadcasts to workers in a thread; the view shows the latest answer."""

    def __init__(self, timeout: float, every: float) -> None:
        self.timeout, self.every = timeout, every
        self.latest: dict[str, Any] | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="worker-poller")

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.latest = ms.workers(default_app(), self.timeout)
            self.stop.wait(self.every)

    def start(self) -> WorkerPoller:
        self.thread.start()
        return self


def watch(
    s: Settings, interval: float = 1.0, inspect_timeout: float = 1.0, window: float = 30.0
) -> None:
    """Redraw until Ctrl-C; `recent` rates are over about `window` seconds."""
    poller = WorkerPoller(inspect_timeout, max(interval, 2.0)).start()
    history: list[dict[str, Any]] = []
    try:
        with Live(console=Console(), refresh_per_second=4, screen=False) as live:
            while True:
                snap = msnap.snapshot(s, workers_timeout=None)
                snap["workers"] = poller.latest
                history.append(snap)
                while len(history) > 2 and history[1]["time"] <= snap["time"] - window:
                    history.pop(0)
                base = history[0] if len(history) > 1 else None
                live.update(render(snap, recent_rates(base, snap) if base else None))
                time.sleep(interval)
    finally:
        poller.stop.set()


def main(a: argparse.Namespace) -> None:
    """Entry point for `control.sh status` (flags: --json, --watch, --interval, --inspect-timeout)."""
    s = get_settings()
    timeout = getattr(a, "inspect_timeout", 1.0)
    if getattr(a, "no_workers", False):
        timeout = None
    if a.watch and not a.json:
        watch(s, a.interval, timeout or 1.0)
    else:
        show(s, a.json, timeout)
