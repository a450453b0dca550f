"""What the alert rules measure: a sample of the crawl's counters and state, each rule's value
per subject from it, and the readable line that says so."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis
from celery import Celery

from config import Settings
from monitor import health
from monitor import status as st
from monitor.alert_rules import RATE_KINDS, Rule
from monitor.fleet import describe_shortage, fleet_view
from utils.keyspace import Keyspace
from utils.slots import SlotsLost, lost_for, lost_ranges, reason

log = logging.getLogger("chaincrawl.alerts")

TASK_FIELDS = ("succeeded", "failed", "retried", "started")


@dataclass
class Sample:
    """Cumulative counters at one moment: what windowed rates are computed from."""

    t: float
    tasks: dict[str, list[int]]
    queues: dict[str, int]
    dead: int

    def encode(self) -> bytes:
        return orjson.dumps(
            {"t": self.t, "tasks": self.tasks, "queues": self.queues, "dead": self.dead}
        )

    @classmethod
    def decode(cls, raw: bytes) -> Sample:
        d = orjson.loads(raw)
        return cls(d["t"], d["tasks"], d["queues"], d["dead"])


@dataclass
class Observation:
    sample: Sample
    pools: dict[str, health.PoolHealth]
    outbox: dict[str, Any]
    workers: list[str] | None
    idle_runs: dict[str, float] = field(default_factory=dict)  # `{chain}/{run}` -> seconds
    resending: dict[str, int] = field(default_factory=dict)  # `{chain}/{run}` -> re-sends
    fleet: list[dict[str, Any]] = field(default_factory=list)  # monitor.fleet.fleet_view rows
    broken: list[dict[str, Any]] = field(default_factory=list)  # monitor.status.broken_modules
    unserved: dict[str, int] = field(default_factory=dict)  # queue -> messages no worker takes
    lost: dict[str, tuple[int, str]] = field(default_factory=dict)  # slots -> (runs, reason)


def observe(
    client: Any, s: Settings, now: float, ping: Callable[[], list[str] | None] | None
) -> Observation:
    ranges = lost_ranges(client)

    def part(fn: Callable[[], Any], default: Any) -> Any:
        """With a slot range lost, what no node serves is left out of this observation."""
        try:
            return fn()
        except (SlotsLost, redis.RedisError, redis.exceptions.RedisClusterException):
            if not ranges:
                raise
            return default

    tm = part(lambda: st.task_metrics(client, s), {})
    tasks = {t: [m.get(f, 0) for f in TASK_FIELDS] for t, m in tm.items()}
    broker = st.broker_client(client, s)
    sample = Sample(
        now, tasks, st.queue_depths(broker, s), part(lambda: st.dead_letters(client, s), 0)
    )
    pools = part(lambda: {h.name: h for h in health.collect(client, s)}, {})
    lost: dict[str, tuple[int, str]] = {}
    if ranges:
        rids = part(
            lambda: [m.decode() for m in client.smembers(Keyspace(s.key_prefix).active_runs)], []
        )
        paused = st.lost_runs(client, rids, s)
        for r in ranges:
            n = sum(1 for rid in paused if lost_for([r], Keyspace(s.key_prefix).run(rid)))
            lost[r.slots] = (n, reason([r]))
    return Observation(
        sample,
        pools,
        part(lambda: st.outbox(client, s), {}),
        ping() if ping else None,
        part(lambda: st.idle_runs(client, s, now), {}),
        part(lambda: st.resending_runs(client, s), {}),
        part(lambda: fleet_view(client, s), []),
        part(lambda: st.broken_modules(client, s), []),
        part(lambda: st.unserved_queues(client, s, sample.queues), {}),
        lost,
    )


def _delta(
    cur: Mapping[str, list[int]], base: Mapping[str, list[int]] | None, by: str
) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for task, vals in cur.items():
        old = (base or {}).get(task, [0] * len(vals))
        d = [c - o if c >= o else c for c, o in zip(vals, old, strict=False)]  # reset -> restart
        key = st.site_of(task) if by == "site" else task
        acc = out.setdefault(key, [0] * len(vals))
        for i, v in enumerate(d):
            acc[i] += v
    return out


def rule_values(rule: Rule, obs: Observation, base: Sample | None) -> dict[str, float | None]:
    """The rule's measured value per subject (None: not enough data to judge)."""
    cur = obs.sample
    vals: dict[str, float | None] = {}
    if rule.kind in RATE_KINDS:
        if base is None:
            return {}
        for subj, (ok, failed, retried, started) in _delta(cur.tasks, base.tasks, rule.by).items():
            if rule.kind == "failure_rate":
                n, bad = ok + failed, failed
            else:
                n, bad = started, retried
            vals[subj] = bad / n if n >= max(1, rule.min_events) else None
    elif rule.kind in ("pool_size", "pool_bans"):
        for name, h in obs.pools.items():
            vals[name] = float(h.size if rule.kind == "pool_size" else h.bans)
    elif rule.kind == "queue_depth":
        vals = {q: float(n) for q, n in cur.queues.items()}
    elif rule.kind == "queue_growth":
        if base is None:
            return {}
        for q, n in cur.queues.items():
            grown = n - base.queues.get(q, 0)
            vals[q] = float(grown) if n >= rule.min_depth else None
    elif rule.kind == "outbox_backlog":
        vals["outbox"] = float(obs.outbox.get("length", 0))
    elif rule.kind == "outbox_age":
        vals["outbox"] = float(obs.outbox.get("oldest_entry_age") or 0.0)
    elif rule.kind == "dead_letters":
        if base is None:
            return {}
        vals["deadletter"] = float(max(0, cur.dead - base.dead))
    elif rule.kind == "workers":
        vals["workers"] = float(len(obs.workers)) if obs.workers is not None else None
    elif rule.kind == "run_idle":
        vals = dict(obs.idle_runs)
    elif rule.kind == "run_resending":
        vals = {k: float(v) for k, v in obs.resending.items()}
    elif rule.kind == "fleet_shortage":  # only sites with work waiting are judged
        vals = {r["site"]: r["runs_at"] for r in obs.fleet if r["backlog"] > r["held"]}
    elif rule.kind == "sink_failing":
        vals = {name: 1.0 for name in obs.outbox.get("errors") or {}}
    elif rule.kind == "queue_unserved":
        vals = {q: float(n) for q, n in obs.unserved.items()}
    elif rule.kind == "module_broken":
        vals = {b["module"]: float(len(b["in"])) for b in obs.broken}
    elif rule.kind == "slots_lost":
        vals = {slots: float(n) for slots, (n, _) in obs.lost.items()}
    return {k: v for k, v in vals.items() if fnmatch.fnmatchcase(k, rule.match)}


def causes(rule: Rule, obs: Observation) -> dict[str, str]:
    """Why a subject breaches, where a kind knows (a fleet shortage names its cause)."""
    if rule.kind == "fleet_shortage":
        return {r["site"]: describe_shortage(r) for r in obs.fleet if r["shortage"]}
    if rule.kind == "sink_failing":
        return {n: str(e.get("error", "")) for n, e in (obs.outbox.get("errors") or {}).items()}
    if rule.kind == "module_broken":
        return {b["module"]: f"{b['file']}:{b['line']}: {b['error']}" for b in obs.broken}
    if rule.kind == "slots_lost":
        return {slots: why for slots, (_, why) in obs.lost.items()}
    return {}


def describe(
    rule: Rule, subject: str, value: float | None, recovered: bool = False, cause: str = ""
) -> str:
    """One readable line for the log and the webhook's `summary` (with its cause, if known)."""

    def fmt(v: float | None) -> str:
        if v is None:
            return "no data"
        if rule.kind in (*RATE_KINDS, "fleet_shortage"):
            return f"{v:.0%}"
        return f"{v:g}"

    limit = f"> {fmt(rule.above)}" if rule.above is not None else f"< {fmt(rule.below)}"
    what = {
        "failure_rate": f"failure rate of {subject} over {rule.window:g}s",
        "retry_rate": f"retry rate of {subject} over {rule.window:g}s",
        "pool_size": f"size of pool {subject}",
        "pool_bans": f"bans in pool {subject}",
        "queue_depth": f"depth of queue {subject}",
        "queue_growth": f"growth of queue {subject} over {rule.window:g}s",
        "outbox_backlog": "outbox backlog",
        "outbox_age": "age of the oldest unstored item (s)",
        "dead_letters": f"dead letters in {rule.window:g}s",
        "workers": "workers answering",
        "run_idle": f"time since run {subject} last finished a task (s)",
        "run_resending": f"tasks of run {subject} re-sent since it last finished one",
        "fleet_shortage": f"share of its entitlement site {subject} runs at",
        "sink_failing": f"failing writes of sink {subject}",
        "queue_unserved": f"messages in queue {subject} (no live worker consumes it)",
        "module_broken": f"processes that failed to import module {subject}",
        "slots_lost": f"runs paused on lost slots {subject}",
    }.get(rule.kind, f"{subject} (rule no longer configured)")
    if recovered:
        return f"[{rule.name}] recovered: {what} is {fmt(value)} (limit {limit})"
    tail = f": {cause}" if cause else ""
    return f"[{rule.name}] {what} is {fmt(value)} ({limit}){tail}"


def celery_ping(app: Celery, timeout: float = 1.0) -> list[str] | None:
    """Names of workers answering a broadcast ping; None when the broker is unreachable."""
    try:
        replies = app.control.ping(timeout=timeout) or []
    except Exception as exc:
        log.warning("worker ping failed: %s", exc)
        return None
    return sorted(name for r in replies for name in r)
