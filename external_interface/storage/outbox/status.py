"""What waits for storage (`control.sh status`, the exporter, the alerts), and putting dead
letters back.

On one Redis that is the global stream `{prefix}:outbox` and its dead letters. On a Redis
Cluster each run has its own stream and dead-letter stream in its slot (cluster.py), so
`outbox_streams` finds them - the streams of the active and storing runs, of the runs with
dead letters (`outbox:deadruns`, which the drainer writes) and of tasks without a run; with
`scan` also every run stream or dead-letter stream a SCAN of every master finds (what a
drainer that died before noting its dead letters left). `backlog` sums (ages: the maximum)
over them, with a row per run; it scans only when asked (`--status` does, the exporter, the
alerts and `control.sh status` do not: a SCAN walks the whole keyspace, dedup included).
`requeue_dead` scans, and moves each run's dead letters back to the run's own stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import orjson
import redis

from external_interface.storage.outbox.entries import (
    ENTRY_FIELDS,
    GROUP,
    OutboxEntry,
    counters_key,
    dead_key,
    errors_key,
    stream_key,
)
from settings.storage import get_storage_settings
from utils.keyspace import Keyspace
from utils.lua import load_lua
from utils.redis import as_str, is_cluster

if TYPE_CHECKING:
    from config import Settings

REQUEUE = load_lua(__file__, "requeue.lua")
SCAN_COUNT = 1000


@dataclass(frozen=True)
class OutboxStream:
    """An outbox stream and its dead letters; `rid` is the run ("" tasks without a run, None
    the global stream); `noted`: the run is in `outbox:deadruns`."""

    key: str
    dead: str
    rid: str | None
    noted: bool = False


def _glob_escape(text: str) -> str:
    """`text` matched literally by a SCAN pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def outbox_streams(client: redis.Redis, prefix: str, scan: bool = False) -> list[OutboxStream]:
    """Every outbox stream to look at: on one Redis the global one; on a cluster also the
    streams of tasks without a run, of the active and storing runs and of the runs noted with
    dead letters, and with `scan` every run stream or dead-letter stream a SCAN of the
    masters finds (the global one first, then by run)."""
    glob = OutboxStream(stream_key(prefix), dead_key(prefix), None)
    if not is_cluster(client):
        return [glob]
    ks = Keyspace(prefix)
    pipe = client.pipeline(transaction=False)
    pipe.smembers(ks.active_runs)
    pipe.smembers(ks.storing_runs)
    pipe.smembers(ks.outbox_dead_runs)
    active, storing, deadruns = pipe.execute()
    noted = {as_str(m) for m in deadruns}
    rids = {"", *noted, *(as_str(m) for m in (*active, *storing))}
    if scan:
        head = ks.key("run", "{")  # a run's keys start `cc:run:{<rid>}`
        pattern = _glob_escape(head) + "*}:outbox*"
        for raw in client.scan_iter(match=pattern, count=SCAN_COUNT, target_nodes=client.PRIMARIES):  # type: ignore[attr-defined]
            key = as_str(raw)
            rid = key[len(head) :].partition("}")[0]
            with contextlib.suppress(ValueError):  # braces in the id: not a key of ours
                if key in (ks.run_outbox(rid), ks.run_outbox_dead(rid)):
                    rids.add(rid)
    found = [
        OutboxStream(ks.run_outbox(r), ks.run_outbox_dead(r), r, r in noted) for r in sorted(rids)
    ]
    return [glob, *found]


def _age(entry_id: str | None, now_ms: int) -> float | None:
    if not entry_id:
        return None
    return max(0.0, (now_ms - int(entry_id.split("-")[0])) / 1000)


def backlog(
    client: redis.Redis, prefix: str | Settings, group: str = GROUP, scan: bool = False
) -> dict[str, Any]:
    """What waits for storage: for `control.sh status` and tests (`prefix` or the settings).

    `length` counts entries not yet stored (stored ones are deleted); `pending` of them were
    read by a drainer that has not confirmed them; `undelivered` were never read. On a
    cluster: the sum over every stream (`cluster_backlog`; `scan`: SCAN the masters too).
    """
    if not isinstance(prefix, str):
        prefix = prefix.key_prefix
    if is_cluster(client):
        return cluster_backlog(client, prefix, group, scan=scan)
    key = stream_key(prefix)
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.xlen(key)
    pipe.xrange(key, "-", "+", count=1)
    pipe.xlen(dead_key(prefix))
    pipe.hgetall(errors_key(prefix))
    now, length, first, dead, errors = pipe.execute()
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    pending: dict[str, Any] = {"pending": 0, "min": None, "consumers": []}
    with contextlib.suppress(redis.ResponseError):  # no stream or group yet
        pending = client.xpending(key, group)
    n_pending = int(pending.get("pending") or 0)
    return {
        "stream": key,
        "length": int(length),
        "pending": n_pending,
        "undelivered": max(0, int(length) - n_pending),
        "oldest_pending_age": _age(as_str(pending.get("min")), now_ms) if n_pending else None,
        "oldest_entry_age": _age(as_str(first[0][0]), now_ms) if first else None,
        "consumers": {as_str(c["name"]): int(c["pending"]) for c in pending.get("consumers") or []},
        "dead": int(dead),
        "errors": {as_str(k): orjson.loads(v) for k, v in errors.items()},
    }


def cluster_backlog(
    client: redis.Redis,
    prefix: str,
    group: str = GROUP,
    claim_idle: float | None = None,
    scan: bool = False,
) -> dict[str, Any]:
    """`backlog` on a cluster: the fields summed over every stream of `outbox_streams` (the
    ages: the oldest), `claimable` the pending entries idle for `claim_idle` seconds (the
    drainers' `CHAINCRAWL_OUTBOX_CLAIM_IDLE`: another drainer takes them over), `streams`
    how many were read, and `runs` a row per stream holding something, by run id ("" tasks
    without a run, "*" the global stream)."""
    if claim_idle is None:
        claim_idle = get_storage_settings().outbox_claim_idle
    streams = outbox_streams(client, prefix, scan=scan)
    pipe = client.pipeline(transaction=False)
    for s in streams:
        pipe.xlen(s.key)
        pipe.xrange(s.key, "-", "+", count=1)
        pipe.xlen(s.dead)
        pipe.xpending(s.key, group)
    pipe.hgetall(errors_key(prefix))
    res = pipe.execute(raise_on_error=False)
    for r in res:  # "no such key" / "no group" mean empty; a connection error is raised
        if isinstance(r, Exception) and not isinstance(r, redis.ResponseError):
            raise r
    errors = res[-1] if isinstance(res[-1], dict) else {}
    settled: list[str] = []  # noted with dead letters, none left: forgotten
    t = client.time()
    now_ms = int(t[0]) * 1000 + int(t[1]) // 1000
    rows: dict[str, dict[str, Any]] = {}
    pend_of: dict[OutboxStream, int] = {}
    consumers: dict[str, int] = {}
    for n, s in enumerate(streams):
        length, first, dead, pending = res[4 * n : 4 * n + 4]
        length = 0 if isinstance(length, Exception) else int(length)
        dead = 0 if isinstance(dead, Exception) else int(dead)
        first = [] if isinstance(first, Exception) else first
        if isinstance(pending, Exception) or not pending:
            pending = {"pending": 0, "min": None, "consumers": []}
        n_pending = int(pending.get("pending") or 0)
        for c in pending.get("consumers") or []:
            name = as_str(c["name"])
            consumers[name] = consumers.get(name, 0) + int(c["pending"])
        if n_pending:
            pend_of[s] = n_pending
        if s.noted and not dead and s.rid is not None:
            settled.append(s.rid)
        if not (length or dead or n_pending):
            continue
        rows["*" if s.rid is None else s.rid] = {
            "stream": s.key,
            "length": length,
            "pending": n_pending,
            "claimable": 0,
            "undelivered": max(0, length - n_pending),
            "oldest_pending_age": _age(as_str(pending.get("min")), now_ms) if n_pending else None,
            "oldest_entry_age": _age(as_str(first[0][0]), now_ms) if first else None,
            "dead": dead,
        }
    if settled:
        client.srem(Keyspace(prefix).outbox_dead_runs, *settled)
    if pend_of:  # the pending entries idle long enough to be claimed
        pipe = client.pipeline(transaction=False)
        for s, n_pending in pend_of.items():
            pipe.xpending_range(s.key, group, "-", "+", n_pending, idle=int(claim_idle * 1000))
        for s, got in zip(pend_of, pipe.execute(raise_on_error=False), strict=True):
            if not isinstance(got, Exception):
                rows["*" if s.rid is None else s.rid]["claimable"] = len(got)
    return {
        "stream": Keyspace(prefix).run_outbox("*"),
        "streams": len(streams),
        "length": sum(r["length"] for r in rows.values()),
        "pending": sum(r["pending"] for r in rows.values()),
        "claimable": sum(r["claimable"] for r in rows.values()),
        "undelivered": sum(r["undelivered"] for r in rows.values()),
        "oldest_pending_age": _oldest(r["oldest_pending_age"] for r in rows.values()),
        "oldest_entry_age": _oldest(r["oldest_entry_age"] for r in rows.values()),
        "consumers": consumers,
        "dead": sum(r["dead"] for r in rows.values()),
        "errors": {as_str(k): orjson.loads(v) for k, v in errors.items()},
        "runs": rows,
    }


def _oldest(ages: Iterable[float | None]) -> float | None:
    return max((a for a in ages if a is not None), default=None)


def requeue_dead(client: redis.Redis, prefix: str, count: int | None = None) -> int:
    """Move dead-lettered entries back into the outbox (after fixing the sink or the data).

    On a cluster each run's dead letters go back to the run's own stream (one script per
    entry, in the run's slot), and a run that got some back is added to `runs:storing`, so
    the drainers read its stream again; the global dead letters stay (no cluster drainer
    reads the global stream)."""
    if not is_cluster(client):
        return _requeue(client, stream_key(prefix), dead_key(prefix), None, prefix, count)
    moved = 0
    ks = Keyspace(prefix)
    for s in outbox_streams(client, prefix, scan=True):
        if s.rid is None or (count is not None and moved >= count):
            continue
        n = _requeue(client, s.key, s.dead, s.rid, prefix, None if count is None else count - moved)
        if n and s.rid:  # beside the script (another slot); the drainers read storing runs
            client.sadd(ks.storing_runs, s.rid)
        moved += n
    return moved


def _requeue(
    client: redis.Redis, stream: str, dead: str, rid: str | None, prefix: str, count: int | None
) -> int:
    """Dead letters of `dead` back to `stream`, each taken off its run's `store_failed`. On a
    cluster (`rid` not None) only the counters of the stream's own run are in its slot: an
    entry naming another run is requeued uncounted."""
    script = client.register_script(REQUEUE)
    rows = cast(
        "list[tuple[bytes, dict[bytes, bytes]]]", client.xrange(dead, "-", "+", count=count)
    )
    moved = 0
    for dead_id, fields in rows:
        original: list[Any] = []
        for k in ENTRY_FIELDS:
            if k in fields:
                original += [k, fields[k]]
        e = OutboxEntry.parse(fields.get(b"orig_id", b"0-0"), fields)
        counted = e.run and (rid is None or e.run == rid)
        ck = counters_key(prefix, e.run) if counted else stream
        moved += int(
            script(keys=[stream, dead, ck], args=[dead_id, e.step, len(e.items), *original])
        )
    return moved
