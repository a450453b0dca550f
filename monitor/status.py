"""What the cluster is doing, gathered from Redis (and the broker) for every monitoring view.

The exporter, the alert evaluator and `control.sh status` all read through these functions,
so a number means the same thing on a dashboard, in an alert and in the terminal. Nothing
here renders; `cli/status.py` draws the snapshot with rich.

Also here: `task_argsrepr`, the masked text Celery puts in a message's `argsrepr` header, which
is what task events, Flower and `inspect active` show instead of the raw arguments.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from celery import Celery

import sites
from broker.app import BASE_QUEUES
from broker.workers import TaskSets
from chains import registry as chain_registry
from chains.runner import RunHandle
from config import Settings, get_settings
from external_interface.fetch.adaptive import AdaptiveStore
from external_interface.storage.outbox import backlog
from ledger.model import chain_from_dict
from ledger.state import RunState, run_status, stalled_resends
from monitor.deadletter import DeadLetterStore
from monitor.metrics import LATENCY_BUCKETS_MS, read_hashes
from scheduling.recrawl import History, Watch, recrawl_clock
from utils.keyspace import Keyspace
from utils.logsafe import MASK, is_secret_key, mask, task_argsrepr  # noqa: F401
from utils.redis import get_redis
from utils.slots import lost_for, lost_ranges, reason

log = logging.getLogger(__name__)

# every outcome a started attempt ends in: `cancelled` (its run was cancelled, not fetched),
# `paused` (parked while its run was paused) and `duplicate` (a redelivery of an attempt
# already committed or parked) so that started = the others summed, once attempts finish
OUTCOMES = (
    "started",
    "succeeded",
    "failed",
    "retried",
    "waited",
    "skipped",
    "cancelled",
    "paused",
    "duplicate",
)
ERROR_OUTCOMES = ("failed", "retried", "waited")

# masking lives in utils/logsafe.py; re-exported for the callers of these names


# --- Redis readers -----------------------------------------------------------------------------


def task_metrics(client: Any, s: Settings | None = None) -> dict[str, dict[str, int]]:
    """Every `metrics:task:{task}` hash, pipelined (one round trip after the scan)."""
    return read_hashes(client, (s or get_settings()).key("metrics", "task", ""))


def site_metrics(client: Any, s: Settings | None = None) -> dict[str, dict[str, int]]:
    return read_hashes(client, (s or get_settings()).key("metrics", "site", ""))


def site_of(task: str) -> str:
    return task.split(".", 1)[0]


def broker_client(client: Any, s: Settings) -> Any:
    """A client on the broker's Redis: `client` itself unless BROKER_URL names another server."""
    if not s.redis_broker or s.broker_url == s.redis_url:
        return client
    return get_redis(s.broker_url)


def queue_names() -> list[str]:
    """The queues workers consume: one per site, then the shared ones."""
    return list(dict.fromkeys([*sites.sites(), *BASE_QUEUES]))


def queue_depths(
    client: Any, s: Settings | None = None, queues: Iterable[str] | None = None
) -> dict[str, int]:
    """Messages waiting per queue on a Redis broker (the sum of its priority sub-lists).

    Empty for other brokers (RabbitMQ shows its own queue depths in its management UI).
    """
    s = s or get_settings()
    if not s.redis_broker:
        return {}
    prefix = s.broker_key_prefix
    if queues is not None:
        qs = list(queues)
    else:  # the configured queues, plus any other queue holding messages (a retired site)
        found = set(queue_names())
        for k in client.scan_iter(match=prefix + "*", count=1000, _type="list"):
            name = k.decode()[len(prefix) :]
            base, sep, p = name.rpartition(":")
            found.add(base if sep and p.isdigit() else name)
        qs = sorted(found)
    pipe = client.pipeline(transaction=False)
    for q in qs:
        pipe.llen(prefix + q)
        for p in range(1, 10):
            pipe.llen(f"{prefix}{q}:{p}")
    res = pipe.execute()
    return {q: int(sum(res[i * 10 : i * 10 + 10])) for i, q in enumerate(qs)}


def unacked(client: Any, s: Settings | None = None) -> int:
    """Messages delivered to a worker and not yet acknowledged (running, prefetched, countdown)."""
    s = s or get_settings()
    if not s.redis_broker:
        return 0
    return int(client.hlen(f"{s.broker_key_prefix}unacked"))


def outbox(client: Any, s: Settings | None = None) -> dict[str, Any]:
    """Items waiting for storage (external_interface.storage.outbox.backlog)."""
    s = s or get_settings()
    return backlog(client, s.key_prefix)


def adaptive(client: Any, s: Settings | None = None) -> list[dict[str, Any]]:
    """Each `render="auto"` endpoint's decision per URL pattern: pages fetched and rendered,
    the share rendered, its samples, how often it changed, and the newest sample's verdict."""
    s = s or get_settings()
    out = []
    for d in AdaptiveStore(client, s.key_prefix).decisions(evidence=1):
        out.append(
            {
                "endpoint": d.endpoint,
                "pattern": d.pattern,
                "decision": d.decision,
                "pages": d.pages,
                "fetched": d.fetched,
                "rendered": d.rendered,
                "rendered_share": round(d.rendered_share, 4),
                "samples": d.samples,
                "same": d.same,
                "differ": d.differ,
                "changes": d.changes,
                "decided_at": d.decided_at,
                "evidence": d.evidence[0] if d.evidence else None,
            }
        )
    return out


def dead_letters(client: Any, s: Settings | None = None) -> int:
    return DeadLetterStore(client, s).count()


def malformed(client: Any, s: Settings | None = None) -> int:
    """Broker payloads no worker could decode, skipped and kept aside (broker/kombu_guard.py)."""
    s = s or get_settings()
    return int(client.hget(s.key("metrics", "broker"), "malformed") or 0)


def idle_runs(client: Any, s: Settings | None = None, now: float | None = None) -> dict[str, float]:
    """`{chain}/{run id}` -> seconds since the run's last commit (or its start), for active
    runs with tasks outstanding that are not paused (a paused run is idle on purpose)."""
    now = time.time() if now is None else now
    return {
        f"{r['chain']}/{r['run_id']}": max(0.0, now - (r["last"] or r["created"]))
        for r in run_records(client, s, limit=10**9)
        if not r["paused"] and r["outstanding"] and (r["last"] or r["created"])
    }


def resending_runs(client: Any, s: Settings | None = None) -> dict[str, int]:
    """`{chain}/{run id}` -> tasks the sweeper re-sent since the run's last commit, for the
    runs where that is not zero: re-sending that brings no progress is a loop (a message
    every worker drops, a task that never commits) to be named, not waited out."""
    return {
        f"{r['chain']}/{r['run_id']}": r["resending"]
        for r in run_records(client, s, limit=10**9)
        if r["resending"]
    }


def recrawl_watches(client: Any, s: Settings | None = None) -> list[dict[str, Any]]:
    """Per watched set (a `by_change` schedule entry): its site, its budget of pages a day,
    the visits it bought and the changes they found, in the last day and in all, and what the
    change model learned (scheduling/recrawl/history.py `History.summary`)."""
    s = s or get_settings()
    raw = client.hgetall(Keyspace(s.key_prefix).recrawl_watches)
    if not raw:
        return []
    try:
        now = recrawl_clock(client).now()
    except RuntimeError:  # a simulated clock nobody started: show the numbers as of now
        now = time.time()
    out = [
        History(client, s.key_prefix, Watch.from_dict(orjson.loads(v))).summary(now)
        for v in raw.values()
    ]
    return sorted(out, key=lambda w: (w["site"], w["watch"]))


def unknown_tasks(client: Any, s: Settings | None = None) -> int:
    """Messages workers refused as naming a task they do not know (broker/workers.py)."""
    return TaskSets(client, s or get_settings()).unknown_total()


def unserved_queues(client: Any, s: Settings, depths: Mapping[str, int]) -> dict[str, int]:
    """Queues holding messages that no live worker consumes (a site added after the workers
    started, a worker started with the wrong `--queues`): queue -> messages waiting."""
    live = TaskSets(client, s).live().values()
    return {q: n for q, n in depths.items() if n > 0 and not any(w.consumes(q) for w in live)}


def broken_modules(client: Any, s: Settings | None = None) -> list[dict[str, Any]]:
    """Site and chain modules that failed to import, in this process or in a live worker
    (broker/workers.py), each with the processes that failed it (`in`): the rest works."""
    out: dict[str, dict[str, Any]] = {}
    here = [("site", b) for b in sites.broken()] + [("chain", b) for b in chain_registry.broken()]
    for kind, b in here:
        out.setdefault(b.module, {"kind": kind, **b.as_dict(), "in": []})["in"].append("here")
    for w in TaskSets(client, s or get_settings()).live().values():
        for d in w.broken:
            name = str(d.get("module", ""))
            out.setdefault(name, {"kind": "site", **d, "in": []})["in"].append(w.name)
    return [out[k] for k in sorted(out)]


def dead_worker_restored(client: Any, s: Settings | None = None) -> int:
    """Messages given back because the worker holding them died (broker/owners.py)."""
    s = s or get_settings()
    return int(client.hget(s.key("metrics", "broker"), "dead_worker_restored") or 0)


_RUN_FIELDS = (
    "chain",
    "created",
    "status",
    "priority",
    "cancelled",
    "paused",
    "finished",
    "cancel_reason",
    "pause_reason",
    "last",
    "resend_mark",
    "resends_stalled",
)


def run_records(
    client: Any, s: Settings | None = None, limit: int = 50, rids: list[str] | None = None
) -> list[dict[str, Any]]:
    """Active runs and those still storing their items (or `rids`), newest first: chain, age
    and flat counters, without parsing chain trees. Cheap enough for every scrape: two
    pipelined reads per run, capped at `limit`."""
    s = s or get_settings()
    if rids is None:
        rids = sorted(m.decode() for m in client.smembers(Keyspace(s.key_prefix).active_runs))
        state = RunState(client, s)
        if not lost_for(lost_ranges(client), state.storing_key):  # else: not listed meanwhile
            rids = list(dict.fromkeys(rids + state.storing_runs()))
    if not rids:
        return []
    lost = lost_runs(client, rids, s)
    rids = [r for r in rids if r not in lost]
    pipe = client.pipeline(transaction=False)
    for rid in rids:
        pipe.hmget(Keyspace(s.key_prefix).run(rid), *_RUN_FIELDS)
        pipe.hgetall(Keyspace(s.key_prefix).counters(rid))
    res = pipe.execute()
    now = time.time()
    out: list[dict[str, Any]] = []
    for i, rid in enumerate(rids):
        f = dict(zip(_RUN_FIELDS, (v.decode() if v else "" for v in res[2 * i]), strict=True))
        if not f["status"]:  # expired under us
            continue
        chain, created, prio = f["chain"], f["created"], f["priority"]
        counters = {k.decode(): int(v) for k, v in res[2 * i + 1].items()}
        status = run_status(f, counters)
        steps: dict[str, dict[str, int]] = {}
        for k, v in counters.items():
            step, sep, c = k.rpartition(":")
            if sep:
                steps.setdefault(step, {})[c] = v
        finished = float(f["finished"]) if f["finished"] else None
        out.append(
            {
                "run_id": rid,
                "chain": chain,
                "status": status,
                "priority": prio,
                "created": float(created or 0),
                "age": round(now - float(created), 3) if created else None,
                "elapsed": round((finished or now) - float(created), 3) if created else None,
                "last": float(f["last"]) if f["last"] else None,  # its last commit
                "paused": bool(f["paused"]),  # also while a paused run is cancelled (`cancelling`)
                "reason": f["pause_reason"] if f["paused"] else f["cancel_reason"],
                "outstanding": counters.get("outstanding", 0),
                "resending": stalled_resends(f),  # re-sent by the sweeper since its last commit
                "totals": {k: v for k, v in counters.items() if ":" not in k},
                "steps": steps,
            }
        )
    out += [_lost_record(rid, why) for rid, why in lost.items()]
    out.sort(key=lambda r: r["created"], reverse=True)
    return out[:limit]


def lost_runs(client: Any, rids: list[str], s: Settings) -> dict[str, str]:
    """The runs among `rids` whose keys live on a slot range the cluster has lost, each
    with the reason (`utils.slots.reason`): shown paused, their keys not read (no node
    serves them)."""
    ranges = lost_ranges(client)
    if not ranges:
        return {}
    ks = Keyspace(s.key_prefix)
    out = {}
    for rid in rids:
        r = lost_for(ranges, ks.run(rid))
        if r is not None:
            out[rid] = reason([r])
    return out


def _lost_record(rid: str, why: str) -> dict[str, Any]:
    return {
        "run_id": rid,
        "chain": "?",
        "status": "paused",
        "priority": "",
        "created": 0.0,
        "age": None,
        "elapsed": None,
        "last": None,
        "paused": True,
        "reason": why,
        "outstanding": 0,
        "resending": 0,
        "totals": {},
        "steps": {},
        "lost": True,
    }


def recent_runs(
    client: Any,
    s: Settings | None = None,
    limit: int = 20,
    chain: str | None = None,
    status: str | None = None,
) -> list[dict[str, Any]]:
    """The newest runs, finished or not (`run_records` form), of one chain and/or in one
    status (as shown: running, paused, cancelling, storing, done, cancelled) if given."""
    s = s or get_settings()
    state = RunState(client, s)
    out: list[dict[str, Any]] = []
    offset, page = 0, 200 if chain or status else limit
    while len(out) < limit and offset < client.zcard(state.recent_key):
        rids = state.recent(page, offset)  # expired ones are dropped from the index: the
        offset += len(rids)  # next page starts right after the live ones read
        out += [
            r
            for r in run_records(client, s, page, rids)
            if (chain is None or r["chain"] == chain) and (status is None or r["status"] == status)
        ]
    return out[:limit]


def active_runs(client: Any, s: Settings | None = None, limit: int = 20) -> list[dict[str, Any]]:
    """Progress of the newest active runs (as `RunHandle.progress().as_dict()`, chain order)."""
    state = RunState(client, s or get_settings())
    out = []
    for rec in run_records(client, s, limit):
        if rec.get("lost"):  # its keys are on a lost slot range: its reason, nothing else
            out.append(
                {
                    **rec,
                    "complete": False,
                    "ended": False,
                    "ending": "paused",
                    "ok": False,
                    "failed": 0,
                    "waiting": 0,
                    "skips": {},
                    "elapsed": 0.0,
                }
            )
            continue
        try:
            raw = state.chain_def(rec["run_id"])
            chain = chain_from_dict(orjson.loads(raw))  # type: ignore[arg-type]
            out.append(RunHandle(rec["run_id"], chain, state).progress().as_dict())
        except Exception:  # a run record that expired under us
            continue
    return out


def workers(app: Celery, timeout: float = 1.0) -> dict[str, Any] | None:
    """Workers answering a broadcast within `timeout`, with the tasks each is running.

    None when the broker cannot be reached. Our pid files (`processes`) list what this machine
    started; this lists what is alive anywhere on the broker.
    """
    try:
        replies = app.control.inspect(timeout=timeout).active() or {}
    except Exception as exc:
        log.warning("inspecting workers failed: %s", exc)
        return None
    out: dict[str, Any] = {}
    for name, tasks in sorted(replies.items()):
        out[name] = {
            "active": len(tasks or ()),
            "tasks": [
                {
                    "id": t.get("id"),
                    "name": t.get("name"),
                    "args": t.get("args"),
                    "started": t.get("time_start"),
                }
                for t in tasks or ()
            ],
        }
    return out


def processes(s: Settings | None = None) -> dict[str, int]:
    """Processes `control.sh` started on this machine (pid files in var/run that are alive)."""
    s = s or get_settings()
    out: dict[str, int] = {}
    for pidfile in sorted((s.var_dir / "run").glob("*.pid")):
        try:
            pid = int(pidfile.read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            continue
        out[pidfile.stem] = pid
    return out


# --- derived numbers -------------------------------------------------------------------------


def latency_buckets(m: Mapping[str, int]) -> list[tuple[float, int]]:
    """Cumulative (upper bound seconds, count) pairs, ending with +Inf."""
    out = [(b / 1000.0, int(m.get(f"latency_le:{b}", 0))) for b in LATENCY_BUCKETS_MS]
    out.append((float("inf"), int(m.get("latency_le:+Inf", m.get("latency_count", 0)))))
    return out


def bucket_quantile(q: float, buckets: list[tuple[float, int]]) -> float | None:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket holding q."""
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            width = count - prev_count
            frac = (rank - prev_count) / width if width else 1.0
            return prev_bound + (bound - prev_bound) * frac
        prev_bound, prev_count = bound, count
    return prev_bound


def breakdown(m: Mapping[str, int], prefix: str) -> dict[str, int]:
    p = prefix + ":"
    return {k[len(p) :]: v for k, v in m.items() if k.startswith(p) and v}


def hook_counts(m: Mapping[str, int]) -> dict[tuple[str, str], dict[str, int]]:
    """(point, hook) -> calls, us and each signal, from `hook:<point>:<hook>:<what>` fields
    (lifecycle/hooks.py)."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for k, v in m.items():
        if k.startswith("hook:"):
            _, point, rest = k.split(":", 2)
            hook, _, what = rest.rpartition(":")
            out.setdefault((point, hook), {})[what] = v
    return out


def summary(m: Mapping[str, int]) -> dict[str, Any]:
    """Counters plus rates of one task or site hash, as status and alerts show them."""
    ok, failed = m.get("succeeded", 0), m.get("failed", 0)
    started, retried = m.get("started", 0), m.get("retried", 0)
    finished = ok + failed
    n_lat = m.get("latency_count", 0)
    buckets = latency_buckets(m)
    p95 = bucket_quantile(0.95, buckets)
    return {
        **{o: m.get(o, 0) for o in OUTCOMES},
        "fail_rate": round(failed / finished, 4) if finished else None,
        "retry_rate": round(retried / started, 4) if started else None,
        "requests": m.get("requests", 0),
        "bytes": m.get("bytes", 0),
        "items": m.get("items", 0),
        "stored": m.get("stored"),
        # requests never sent: robots.txt (`skipped:robots`), crawled before (`skip_seen_hours`)
        "skips": {"robots": m.get("skipped:robots", 0), "seen": m.get("skipped_seen", 0)},
        # responses decoded with U+FFFD for bytes their charset cannot decode, and those bytes
        "undecodable": m.get("undecodable", 0),
        "undecodable_bytes": m.get("undecodable_bytes", 0),
        "empty": m.get("empty", 0),  # pages that yielded nothing (no item, no follow-up)
        "latency_avg": round(m.get("latency_ms_sum", 0) / n_lat / 1000, 4) if n_lat else None,
        "latency_p95": round(p95, 4) if p95 is not None else None,
        "http": breakdown(m, "http"),
        "errors": {o: breakdown(m, o) for o in ERROR_OUTCOMES if breakdown(m, o)},
        "hooks": {f"{p}:{h}": c for (p, h), c in hook_counts(m).items()},
    }
