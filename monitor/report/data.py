"""What the report shows, gathered from where the numbers live.

    runs, their counters        run:{rid} and run:{rid}:counters (monitor.status.recent_runs)
    pages and items over time   run:{rid}:series (monitor.timeseries), ending at the counters
    errors by type and endpoint the fleet series' task metrics over the window (failed:*,
                                retried:*), and the selected runs' dead letters
    latency percentiles         the fleet series' site histograms over the window
    pool health                 monitor.health now, and the fleet series' pool points
    dedup change rates          the fleet series' dedup marks over the window

Window numbers are the difference between the totals now and the last fleet point at or
before the window's start: totals kept since the counters began cannot say when they grew, the
points can. Without a point from before the start (no worker sampled yet, or the window
reaches past the oldest point kept) the totals themselves are shown, and `fleet_window` says
so (the page too).
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from config import Settings, get_settings
from ledger.model import chain_from_dict
from ledger.state import RunState
from monitor import health, timeseries
from monitor import status as st
from monitor.deadletter import DeadLetterStore

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str) -> float:
    """`24h`, `90m`, `7d`, `3600` -> seconds; a clear error for anything else."""
    m = _DURATION.match(text or "")
    if not m:
        raise ValueError(f"--since {text!r}: expected a duration such as 90m, 24h or 7d")
    return float(m.group(1)) * _UNITS[m.group(2)]


def pages(totals: Mapping[str, int]) -> int:
    """Pages fetched: every attempt that ran to its end (the demo summary's count)."""
    return totals.get("succeeded", 0) + totals.get("failed", 0) + totals.get("retried", 0)


def errors(totals: Mapping[str, int]) -> int:
    """Attempts that ended in an error: retried, or failed for good (dead letters)."""
    return totals.get("failed", 0) + totals.get("retried", 0)


def _sites_of(state: RunState, rid: str) -> set[str]:
    try:
        chain = chain_from_dict(orjson.loads(state.chain_def(rid)))  # type: ignore[arg-type]
    except Exception:  # expired under us
        return set()
    return {st.site_of(node.task) for node in chain.steps.values()}


def select_runs(
    client: Any,
    s: Settings,
    run_id: str | None = None,
    site: str | None = None,
    since: float | None = None,
    now: float | None = None,
    limit: int = 500,
) -> list[dict[str, Any]]:
    """The runs the report covers: one run, or the runs started within `since` seconds (of
    one site's chains when given), newest first."""
    if run_id:
        recs = st.run_records(client, s, rids=[run_id])
        if not recs:
            raise LookupError(
                f"no run {run_id!r} (finished runs are kept for CHAINCRAWL_RUN_RETENTION)"
            )
        return recs
    now = time.time() if now is None else now
    start = now - (since if since is not None else 86400.0)
    state = RunState(client, s)
    out = [r for r in st.recent_runs(client, s, limit=limit) if r["created"] >= start]
    if site:
        out = [r for r in out if site in _sites_of(state, r["run_id"])]
    return out


def _delta(new: Mapping[str, int], old: Mapping[str, int]) -> dict[str, int]:
    return {k: v - old.get(k, 0) for k, v in new.items() if v - old.get(k, 0)}


def _window(points: Sequence[dict[str, Any]], start: float) -> dict[str, Any]:
    """The window's base: the last point at or before `start` (the first one is)."""
    base = points[0]
    for p in points:
        if p["t"] <= start:
            base = p
    return base


def _step(series: Sequence[Sequence[dict[str, Any]]], most: int = 120) -> float:
    """The width of one interval of the chart: the sampling interval the points show (the
    median gap of a run's points; the writers' setting, whatever the reader's), widened so the
    chart has at most `most` intervals."""
    gaps = sorted(
        b["t"] - a["t"] for pts in series for a, b in itertools.pairwise(pts) if b["t"] > a["t"]
    )
    step = max(1.0, gaps[len(gaps) // 2]) if gaps else 60.0
    ts = [p["t"] for pts in series for p in pts]
    span = (max(ts) - min(ts)) if ts else 0.0
    return max(step, span / most)


def timeline(client: Any, s: Settings, runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pages, items and errors per interval, summed over the runs (each run's points, then its
    counters now as the last point)."""
    series = []
    for r in runs:
        points = timeseries.read(client, timeseries.run_series_key(s, r["run_id"]))
        points.append({"t": max(r["last"] or time.time(), r["created"]), "c": r["totals"]})
        series.append(points)
    step = _step(series)
    buckets: dict[float, dict[str, int]] = {}
    for r, points in zip(runs, series, strict=True):
        prev: Mapping[str, int] = {}
        for p in points:
            c = p["c"]
            at = max(p["t"], r["created"])
            slot = round(at - at % step, 3)  # the interval it ends in
            b = buckets.setdefault(slot, {"pages": 0, "items": 0, "errors": 0})
            b["pages"] += pages(c) - pages(prev)
            b["items"] += c.get("items", 0) - prev.get("items", 0)
            b["errors"] += errors(c) - errors(prev)
            prev = c
    return [{"t": t, **v} for t, v in sorted(buckets.items())]


def _latency(site: str, m: Mapping[str, int]) -> dict[str, Any]:
    b = st.latency_buckets(m)
    q = {f"p{int(x * 100)}": st.bucket_quantile(x, b) for x in (0.5, 0.9, 0.99)}
    return {
        "site": site,
        "count": b[-1][1],
        **{k: round(v, 4) if v is not None else None for k, v in q.items()},
    }


def gather(
    client: Any,
    s: Settings | None = None,
    *,
    run_id: str | None = None,
    site: str | None = None,
    since: float | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Everything the report shows, as plain data (the HTML embeds it as JSON too)."""
    s = s or get_settings()
    now = time.time() if now is None else now
    runs = select_runs(client, s, run_id, site, since, now)
    start = min((r["created"] for r in runs), default=now - (since or 86400.0))
    totals: dict[str, int] = {}
    for r in runs:
        for k, v in r["totals"].items():
            totals[k] = totals.get(k, 0) + v
    fleet = timeseries.read(client, timeseries.fleet_key(s))
    newest = timeseries.fleet_point(client, s, now)  # the totals now, against the window's base
    if fleet and fleet[0]["t"] <= start:
        base = _window(fleet, start)
        windowed = True
    else:  # no point from before the window: the totals since the counters began
        base = {"tasks": {}, "sites": {}, "dedup": {}}
        windowed = False
    tasks = {t: _delta(m, base["tasks"].get(t, {})) for t, m in newest["tasks"].items()}
    sites_m = {x: _delta(m, base["sites"].get(x, {})) for x, m in newest["sites"].items()}
    if site:
        tasks = {t: m for t, m in tasks.items() if st.site_of(t) == site}
        sites_m = {x: m for x, m in sites_m.items() if x == site}
    err_rows = []
    for task, m in sorted(tasks.items()):
        for outcome in ("failed", "retried"):
            for reason, n in st.breakdown(m, outcome).items():
                err_rows.append({"task": task, "type": reason, "outcome": outcome, "n": n})
    selected = {r["run_id"] for r in runs}
    dead: dict[tuple[str, str], int] = {}
    for dl in DeadLetterStore(client, s).list(10_000):
        if dl.meta.get("run") in selected:
            dead[(dl.task, dl.error_type)] = dead.get((dl.task, dl.error_type), 0) + 1
    pools_now = health.collect(client, s)
    waits: dict[str, int] = {}
    for x, m in sites_m.items():
        waits[x] = sum(n for k, n in m.items() if k.startswith("waited:ResourceUnavailable"))
    pools = []
    for h in pools_now:
        history = [[p["t"], *p["pools"][h.name][:2]] for p in fleet if h.name in p.get("pools", {})]
        pools.append(
            {
                "name": h.name,
                "kind": h.kind,
                "site": h.site,
                "size": h.size,
                "bans": h.bans,
                "produced": h.produced,
                "exhausted_waits": waits.get(h.site, 0),
                "series": history,
            }
        )
    dedup = []
    for ns, m in sorted(newest.get("dedup", {}).items()):
        d = _delta(m, base.get("dedup", {}).get(ns, {}))
        seen = d.get("unchanged", 0) + d.get("changed", 0)
        dedup.append(
            {
                "namespace": ns,
                "new": d.get("new", 0),
                "unchanged": d.get("unchanged", 0),
                "changed": d.get("changed", 0),
                "change_rate": round(d.get("changed", 0) / seen, 4) if seen else None,
            }
        )
    return {
        "generated": now,
        "selection": {"run": run_id, "site": site, "since": since},
        "window": {
            "start": start,
            "end": now,
            "fleet_points": len(fleet),
            "fleet_window": windowed,
        },
        "runs": [
            {k: r[k] for k in ("run_id", "chain", "status", "created", "elapsed", "totals")}
            for r in runs
        ],
        "totals": {
            "runs": len(runs),
            "pages": pages(totals),
            "items": totals.get("items", 0),
            "stored": totals.get("stored", 0),
            "errors": errors(totals),
            "failed": totals.get("failed", 0),
            "retried": totals.get("retried", 0),
        },
        "timeline": timeline(client, s, runs),
        "errors": err_rows,
        "dead_letters": [{"task": t, "type": e, "n": n} for (t, e), n in sorted(dead.items())],
        "latency": [_latency(x, m) for x, m in sorted(sites_m.items()) if m.get("latency_count")],
        "pools": pools,
        "dedup": dedup,
    }
