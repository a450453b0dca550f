"""The fleet budget as `status` and the alerts see it: per site its share, what it uses, its
backlog, and when it runs below the share its backlog entitles it to, why.

A site's *entitlement* is the water-fill of the fleet's tasks over every site's backlog (tasks
of active runs dispatched and not finished, wherever they wait: in the broker, in a countdown,
running): what it would hold if nothing but the fleet budget held it back. It *runs at*
`in flight / entitlement`. Below SHORT of it, with work waiting, it is short, and the cause is
the first of these that applies: one of its pools has no member ready, its share of the
fleet's leases of a kind is spent, its own limit caps it lower, the adaptive throttle spaces
its requests, or other sites still hold places it is owed (they give them back as their tasks
finish). Nothing found: its tasks wait for a worker slot or in a retry's countdown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from config import Settings, get_settings
from external_interface.resources.pool import pool_stats
from ledger.model import chain_from_dict
from ledger.state import RunState
from scheduling.limits import effective_limits
from scheduling.shares import TASKS, Fleet, allocate, load_budget
from scheduling.throttle import Throttle
from utils.keyspace import Keyspace

SHORT = 0.8  # a site with a backlog running below this share of its entitlement is short
TERMINAL = ("succeeded", "failed", "skipped", "cancelled")  # a step's tasks that finished
POOL_KINDS = ("cookie", "device_id")
SLOW_THROTTLE = 0.5  # seconds between requests from which the throttle counts as a cause


def site_backlog(client: Any, s: Settings | None = None) -> dict[str, int]:
    """Tasks of active runs dispatched and not finished, per site (their step's task's site)."""
    s = s or get_settings()
    state = RunState(client, s)
    rids = sorted(m.decode() for m in client.smembers(Keyspace(s.key_prefix).active_runs))
    out: dict[str, int] = {}
    for rid in rids:
        raw = state.chain_def(rid)
        if raw is None:
            continue
        tasks = {st.id: st.task for st in chain_from_dict(orjson.loads(raw)).root.walk()}
        counters = state.counters(rid)
        for step, task in tasks.items():
            left = counters.get(f"{step}:dispatched", 0) - sum(
                counters.get(f"{step}:{o}", 0) for o in TERMINAL
            )
            if left > 0:
                site = task.split(".", 1)[0]
                out[site] = out.get(site, 0) + left
    return out


def _cause(
    site: str,
    row: Mapping[str, Any],
    pools: Mapping[str, Mapping[str, Any]],
    limits: Mapping[str, Any],
    throttled: Mapping[str, Mapping[str, Any]],
) -> str:
    for kind in POOL_KINDS:
        p = pools.get(f"{kind}:{site}")
        if p is not None and int(p.get("available", 0)) <= 0:
            return f"the {kind} pool is exhausted ({p.get('available', 0)} of {p.get('size', 0)} ready)"
    for kind, d in row["leases"].items():
        if d["want"] and d["held"] >= d["share"]:
            return f"its share of the fleet's {kind} leases ({d['share']:g}) is spent"
    own = limits.get(site) or limits.get("*")
    if own is not None and own.max is not None and own.max < row["entitled"]:
        return f"its own limit allows {own.max} in flight"
    t = throttled.get(site)
    if t is not None and (t["paused_for"] > 0 or t["delay"] >= SLOW_THROTTLE):
        if t["paused_for"] > 0:
            return f"the site asked for a pause (Retry-After: {t['paused_for']:.0f}s left)"
        return f"the adaptive throttle spaces its requests {t['delay']:.2f}s apart"
    if row["waiting"] and row["held"] < row["entitled"]:
        return "other sites still hold places it is owed (they come back as their tasks finish)"
    return "its tasks wait for a worker slot or in a retry's countdown"


def fleet_view(client: Any, s: Settings | None = None) -> list[dict[str, Any]]:
    """One row per site of the fleet budget (nothing without one): weight, priority, nominal
    share, share now, in flight, waiting, backlog, entitlement, `runs_at` (in flight /
    entitlement), its rate share, its lease shares, and `shortage` (the cause) when short."""
    s = s or get_settings()
    budget = load_budget()
    if not budget.on:
        return []
    fleet = Fleet(client, s.key_prefix, budget)
    views = {dim: fs.view() for dim, fs in fleet.dims.items()}
    backlog = site_backlog(client, s)
    cap = budget.dims.get(TASKS, 0)
    entitled = allocate(cap, {k: float(backlog.get(k, 0)) for k in budget.shares}, budget.shares)
    pools = pool_stats(client, s.key_prefix)
    limits = effective_limits(s)
    throttle = Throttle.from_settings(None, s)
    throttled = {t["site"]: t for t in (throttle.usage() if throttle is not None else [])}
    rows = []
    for site, share in sorted(budget.shares.items()):
        tasks = views.get(TASKS, {}).get(site, {"held": 0, "want": 0, "share": 0.0})
        row: dict[str, Any] = {
            "site": site,
            "weight": share.weight,
            "priority": share.priority,
            "nominal": round(budget.nominal(site, TASKS), 3),
            "share": tasks["share"],
            "held": tasks["held"],
            "waiting": tasks["want"],
            "backlog": backlog.get(site, 0),
            "entitled": round(entitled.get(site, 0.0), 3),
            "rate": fleet.rate_of(site),
            "leases": {d: v[site] for d, v in views.items() if d != TASKS and site in v},
        }
        ent = row["entitled"]
        row["runs_at"] = round(row["held"] / ent, 3) if ent >= 1 else None
        short = (
            row["runs_at"] is not None and row["runs_at"] < SHORT and row["backlog"] > row["held"]
        )
        row["shortage"] = _cause(site, row, pools, limits, throttled) if short else None
        rows.append(row)
    return rows


def describe_shortage(row: Mapping[str, Any]) -> str:
    """`demo runs at 30% of its share (3 of 10 in flight, backlog 42): the cookie pool is
    exhausted (0 of 16 ready)`: the line `status` and the alert say."""
    return (
        f"{row['site']} runs at {row['runs_at']:.0%} of its share ({row['held']} of "
        f"{row['entitled']:g} in flight, backlog {row['backlog']}): {row['shortage']}"
    )
