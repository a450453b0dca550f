"""Run records and exact completion counters in Redis.

Keys (prefix `cc` by default; `{rid}` is literal, the run's hash tag: a run's keys share one
Redis Cluster slot, so each script below runs on one node; names from utils/keyspace.py):
    run:{rid}            hash  chain, status (running|done|cancelled), created, finished,
                               priority, def, cancelled (time) and cancel_reason once cancelled,
                               paused (time) and pause_reason while paused; resend_mark and
                               resends_stalled: the sweeper's re-sends since the last commit;
                               compacted (time)
    run:{rid}:counters   hash  outstanding, dispatched, succeeded, failed, retried, items, stored,
                               skipped (robots.txt), skipped_seen, skipped_unique (children
                               not sent), and per step `{step}:{counter}`
    run:{rid}:done       set   task ids that have committed (makes commit idempotent)
    run:{rid}:uniq:<step> set  parameter fingerprints of `unique` steps
    run:{rid}:pending    list  children waiting behind the run's cap (backpressure), and
                               every task of a paused run (`pause`)
    run:{rid}:parked     set   task ids parked since the last resume (parked once each)
    run:{rid}:ledger     hash  tid -> message of every task sent and not yet committed, so
                               chains.sweeper can re-send what the broker lost;
                               `last` in the run hash is the time of the last commit
    run:{rid}:staged     hash  tid -> ids of the children a committed task still has to send
                               (space-separated; their messages are in the ledger)
    run:{rid}:kids:<name> list child messages a client stages (trigger, resume); without a
                               run, `kids:{norun}:<tid>` holds a task's child messages
    run:{rid}:deliv:<tid>:<n>  deliveries of attempt n (the poison cap)
    runs:active          set   run ids not yet done
    runs:storing         set   run ids whose tasks are done but whose items wait in the
                               outbox (shown `storing`; dropped by the readers once stored;
                               on a cluster every run that ends is added, by the committer
                               or the cancel, and a cancelled one kept while its items wait)
    runs:recent          zset  run ids by start time, the newest RECENT_KEEP (`control.sh runs`)
    outbox               stream items handed off for storage (drained by external_interface.storage.outbox);
                               on a cluster the run's own `run:{rid}:outbox` (drained by the
                               outbox's ClusterDrainer, deleted when the run is compacted)

A task's whole result is committed in one Lua script (a batch's tasks in one call): its items go
to the outbox, its children are written to the ledger and staged by id in `run:{rid}:staged`,
the counters move, and
`outstanding` drops by one. The script runs at most once per task id (the `done` set), so a redelivered or
duplicated message can neither store items twice nor count twice. Children are sent after the
commit and their staged entry deleted; a redelivered task that finds itself committed only
re-sends what is still staged and not yet committed (`staged`).
Its tasks are finished exactly when `outstanding` reaches zero, whatever the number of workers;
the run is shown `done` only once the outbox has stored every item its tasks produced
(`stored + store_failed >= items`), `storing` until then (`run_status`).

Compaction (`compact`): once a run is complete and its items are stored, its per-task
bookkeeping (`done`, `uniq:*`, `parked`, `pending`) is dropped and `compacted` set in its
hash; the hash and counters stay for `CHAINCRAWL_RUN_RETENTION`, so progress and
`control.sh runs RID` still show it. A task of a compacted run counts as committed (begin and
commit both read the flag). A task's delivery counter (`run:{rid}:deliv:<tid>:<n>`) goes with its
commit or retry, so a finished page leaves nothing of its own behind.

Cancelling a run (`cancel`) drops its waiting children at once; each of its tasks still in
the broker is skipped when it begins (no fetch, committed as `cancelled`), and a task that was
running commits its items but sends no children. When the last one has committed, the run's
status is `cancelled`. What was stored stays stored.

Pausing a run (`pause`) holds it without losing its place: its children go to the waiting
list instead of the broker, and each of its tasks still in the broker is parked there when it
begins (no fetch, not committed; its delivery not counted). A running task finishes. `resume`
releases the waiting list (up to the cap), and the run goes on where it stopped; cancelling a
paused run drops what waits. Both are one script each, so a task is parked or runs, never both.

Backpressure: a run may have a `cap` on tasks in the broker (`inflight`). Children beyond it
wait in `run:{rid}:pending` (still counted as dispatched and outstanding); every commit frees
one slot and stages waiting children for the committing task to send, in the same
script, so the broker never holds more than the cap of one run's tasks. While nothing waits and
the cap has room, children are staged directly (the usual case: no hop through
`pending`, 2.5 fewer Redis calls per page); once some wait, new ones queue behind them.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import redis

from config import Settings, get_settings
from utils.keyspace import Keyspace
from utils.lua import script
from utils.redis import is_cluster, pipeline, wait_replicas

RUN_TTL = 7 * 24 * 3600  # the default of CHAINCRAWL_RUN_RETENTION (`RunState.ttl`)
RECENT_KEEP = 10_000  # runs listed by `recent` (their records expire after the retention)
DELIV_TTL = 2 * 24 * 3600  # a delivery counter a task never got to commit or retry

COUNTERS = (
    "dispatched", "succeeded", "failed", "retried", "items", "stored", "store_failed",
    "resent",  # re-sent by the sweeper after the broker lost their message
    "cancelled",  # not run: their run was cancelled (`RunState.cancel`)
    "skipped",  # ended without a request on purpose (robots.txt): neither failed nor retried
    # children never sent: crawled within the step's `skip_seen_hours` (the dedup store), or
    # already sent in this run (a `unique` step)
    "skipped_seen", "skipped_unique",
    "undecodable",  # pages whose text had bytes its charset cannot decode (U+FFFD stored)
    "empty",  # pages that yielded nothing (no item, no follow-up): a selector matching nothing?
)  # fmt: skip


@dataclass
class Kid:
    """A child task staged by a commit: sent to the broker right after it."""

    step: str
    task: str
    params: dict[str, Any]
    meta: dict[str, Any]
    task_id: str
    uniq: str = ""

    def encode(self) -> bytes:
        return orjson.dumps(
            {"id": self.task_id, "task": self.task, "params": self.params, "meta": self.meta}
        )


class StagedAt(NamedTuple):
    """Where a commit's children wait until sent: a field of a run's staged hash (`field`
    the task id), or a whole staging list (`field` "": a task without a run, a client's)."""

    key: str
    field: str = ""


def drop_staged(pipe: Any, ats: Sequence[StagedAt]) -> None:
    """Queue (on a pipeline) or run (on a client) the deletes of staged children once sent."""
    lists = [a.key for a in ats if not a.field]
    fields: dict[str, list[str]] = {}
    for a in ats:
        if a.field:
            fields.setdefault(a.key, []).append(a.field)
    if lists:
        pipe.delete(*lists)
    for key, tids in fields.items():
        pipe.hdel(key, *tids)


@dataclass
class CommitCall:
    """One task's commit, waiting to be sent with others (`RunState.run_commits`)."""

    rid: str
    done_key: str
    staging: str  # the run's staged hash, or (without a run) the task's kids list
    args: list[Any]  # its ARGV part: tid, step, outcome, n_items, kids, counts
    forget: tuple[str, ...] = ()  # keys unlinked right after the commit (its delivery counter)
    kids: tuple[bytes, ...] = ()  # its children's messages, as the script stages them
    entries: tuple[Mapping[str, Any], ...] = ()  # its outbox entries (fields)


@dataclass
class Committed:
    """What a commit left: the run's outstanding tasks (0 without a run) and the child
    messages (`Kid.encode()` form) it staged, that the task must now send."""

    outstanding: int
    staged: list[bytes]


class Begun(NamedTuple):
    """What `begin` found for a task about to run."""

    committed: bool  # a redelivery of a task that has committed: only re-send what it staged
    deliveries: int  # of this attempt (0 inside a batch: the batch message's count)
    cancelled: bool = False  # its run was cancelled: skip it (commit it as `cancelled`)
    paused: bool = False  # its run is paused: park it in the run's waiting list (`park`)


@dataclass
class Cancelled:
    """What `RunState.cancel` did."""

    run_id: str
    was: str  # the run's status before: running, done or cancelled ("" = no such run)
    dropped: int  # children waiting behind the run's cap, dropped at once
    outstanding: int  # tasks still in the broker or running: skipped as they begin


@dataclass
class Paused:
    """What `RunState.pause` found: `was` is the status before (running, paused, cancelling,
    done, cancelled; "" = no such run); the run is paused now only if it was running."""

    run_id: str
    was: str


@dataclass
class Resumed:
    """What `RunState.resume` did: `was` as for `Paused`; `released` tasks were moved from
    the waiting list to be sent (the rest follow as the run's cap allows)."""

    run_id: str
    was: str
    released: int


def _committed(reply: list[Any], calls: Sequence[CommitCall]) -> list[Committed | None]:
    """A commit script's flat reply for `calls`: outstanding, then per commit -1 (had already
    committed) or m and its m staged children: a kid staged as its number (the script does
    not copy back a message the caller holds), a waiting child released as its message."""
    left, pos, out = int(reply[0]), 1, []
    for c in calls:
        m = int(reply[pos])
        pos += 1
        if m < 0:
            out.append(None)
            continue
        got = reply[pos : pos + m]
        pos += m
        out.append(Committed(left, [c.kids[x - 1] if isinstance(x, int) else x for x in got]))
    return out


class RunState:
    """All run bookkeeping against one Redis; cheap to build, thread-safe."""

    def __init__(self, client: redis.Redis, settings: Settings | None = None) -> None:
        self.r = client
        self.s = settings or get_settings()
        self.ks = Keyspace(self.s.key_prefix)
        # a cluster runs a script only on keys of one slot: the global keys (active runs, the
        # outbox) are then written beside the run's scripts, not by them
        self.cluster = is_cluster(client)
        self._commit = client.register_script(script(__file__, "commit.lua"))
        self._dispatch = client.register_script(script(__file__, "dispatch.lua"))
        self._cancel = client.register_script(script(__file__, "cancel.lua"))
        self._release = client.register_script(script(__file__, "release.lua"))
        self._pause = client.register_script(script(__file__, "pause.lua"))
        self._resume = client.register_script(script(__file__, "resume.lua"))
        self._park = client.register_script(script(__file__, "park.lua"))
        self._compact = client.register_script(script(__file__, "compact.lua"))
        self.ttl = self.s.run_retention  # run records, their counters and bookkeeping

    # keys (utils/keyspace.py: a run's keys share its hash tag, one cluster slot)
    def run_key(self, rid: str) -> str:
        return self.ks.run(rid)

    def counters_key(self, rid: str) -> str:
        return self.ks.counters(rid)

    def done_key(self, rid: str, tid: str) -> str:
        return self.ks.done(rid, tid)

    def kids_key(self, tid: str, rid: str) -> str:
        """A staging list: a client's (`tid` a staging name) in its run's slot, or a task's
        without a run (`rid` "")."""
        return self.ks.kids(tid, rid)

    def staged_key(self, rid: str) -> str:
        return self.ks.staged(rid)

    def staged_at(self, tid: str, rid: str) -> StagedAt:
        """Where the children a commit of `tid` staged wait until sent."""
        if rid:
            return StagedAt(self.staged_key(rid), tid)
        return StagedAt(self.kids_key(tid, ""), "")

    def staged(self, tid: str, rid: str) -> list[bytes]:
        """The messages of the children a committed task staged and has not sent (read back
        by its redelivery): those of a run still in its ledger, i.e. not committed since."""
        if not rid:
            return self.r.lrange(self.kids_key(tid, ""), 0, -1)
        ids = self.r.hget(self.staged_key(rid), tid)
        if not ids:
            return []
        msgs = self.r.hmget(self.ledger_key(rid), ids.split())
        return [m for m in msgs if m is not None]

    def pending_key(self, rid: str) -> str:
        return self.ks.run(rid, "pending")

    def parked_key(self, rid: str) -> str:
        return self.ks.run(rid, "parked")

    def ledger_key(self, rid: str) -> str:
        return self.ks.run(rid, "ledger")

    def uniq_key(self, rid: str, step: str) -> str:
        return self.ks.uniq_prefix(rid) + step

    def deliveries_key(self, tid: str, attempt: object, rid: str = "") -> str:
        """Deliveries of one attempt of a task (`begin`), dropped when it commits or retries;
        in its run's slot."""
        return self.ks.deliveries(tid, attempt, rid)

    @property
    def active_key(self) -> str:
        return self.ks.active_runs

    def _active(self, rid: str) -> str:
        """The active-runs set as a script's key; on a cluster the run's counters stand in
        (the scripts leave the set alone when it is their counters: see `self.cluster`)."""
        return self.counters_key(rid) if self.cluster else self.active_key

    @property
    def storing_key(self) -> str:
        return self.ks.storing_runs

    def _storing(self, rid: str) -> str:
        """The storing-runs set as the commit script's key; on a cluster the run's counters
        stand in (the caller adds the run: `run_commits`), as for `_active`."""
        return self.counters_key(rid) if self.cluster else self.storing_key

    @property
    def recent_key(self) -> str:
        return self.ks.recent_runs

    @property
    def outbox_key(self) -> str:
        return self.ks.outbox

    # run lifecycle
    def new_run_id(self) -> str:
        """A fresh run id. On a cluster all of a run's keys live on its slot's master, so the
        id is drawn until that master is one holding the fewest active runs: runs started
        one after another spread evenly over the masters, where random ids leave some with
        twice the mean. One run's own load is never split; two triggers at the same instant
        may pick the same master (both read the same counts)."""
        rid = uuid.uuid4().hex[:16]
        if not self.cluster:
            return rid
        masters = [n.name for n in self.r.get_primaries()]
        load = Counter(self._master(r) for r in self.active_runs())
        least = min(load[m] for m in masters)
        wanted = {m for m in masters if load[m] == least}
        for _ in range(64 * len(masters)):  # each draw hits a wanted master >= 1/len(masters)
            if self._master(rid) in wanted:
                break
            rid = uuid.uuid4().hex[:16]
        return rid

    def _master(self, rid: str) -> str:
        """The name (host:port) of the master that holds run `rid`'s slot."""
        return str(self.r.get_node_from_key(self.run_key(rid)).name)

    def create_run(
        self, rid: str, chain_name: str, chain_json: bytes, priority: int, cap: int = 0
    ) -> None:
        """Record a run. `cap` bounds the run's tasks in the broker at once (0 = no bound);
        children beyond it wait in `run:{rid}:pending` and are released as tasks finish."""
        now = f"{time.time():.3f}"
        pipe = pipeline(self.r)
        pipe.hset(
            self.run_key(rid),
            mapping={
                "chain": chain_name,
                "status": "running",
                "created": now,
                "priority": priority,
                "def": chain_json,
                "cap": cap,
            },
        )
        pipe.expire(self.run_key(rid), self.ttl)
        pipe.hset(self.counters_key(rid), "outstanding", 0)
        pipe.expire(self.counters_key(rid), self.ttl)
        pipe.sadd(self.active_key, rid)
        pipe.zadd(self.recent_key, {rid: float(now)})
        pipe.zremrangebyrank(self.recent_key, 0, -RECENT_KEEP - 1)
        pipe.execute()

    def recent(self, limit: int = 20, offset: int = 0) -> list[str]:
        """Run ids, newest first from `offset`, finished or not (whose records have not
        expired: those are dropped from the index as they are met)."""
        rids = [
            m.decode()
            for m in self.r.zrevrange(self.recent_key, offset, offset + max(0, limit - 1))
        ]
        if not rids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for rid in rids:
            pipe.exists(self.run_key(rid))
        alive = pipe.execute()
        gone = [rid for rid, ok in zip(rids, alive, strict=True) if not ok]
        if gone:
            self.r.zrem(self.recent_key, *gone)
        return [rid for rid, ok in zip(rids, alive, strict=True) if ok]

    def cancel(self, rid: str, reason: str = "") -> Cancelled:
        """Stop a run without touching the workers or other runs: its waiting children are
        dropped, its tasks in the broker are skipped as they begin, running ones send no
        children. Idempotent; a finished run is left as it is."""
        was, dropped, left = self._cancel(
            keys=[self.counters_key(rid), self.run_key(rid), self._active(rid),
                  self.pending_key(rid), self.ledger_key(rid)],
            args=[rid, f"{time.time():.3f}", reason[:500]],
        )  # fmt: skip
        was = was.decode() if isinstance(was, bytes) else str(was)
        if self.cluster and was == "running" and int(left) <= 0:
            # the script ended the run; its items still to store wait in its own stream
            self._ended_on_cluster([rid])
        return Cancelled(rid, was, int(dropped), max(0, int(left)))

    def _ended_on_cluster(self, rids: Sequence[str]) -> None:
        """On a cluster the scripts cannot reach the global sets: runs they ended move from
        `runs:active` to `runs:storing` here (the drainers read the streams of storing runs;
        `storing_runs` drops the stored ones). Storing first: a crash in between leaves a run
        in both sets, which the readers settle, never in neither."""
        rids = list(dict.fromkeys(rids))
        if rids:
            self.r.sadd(self.storing_key, *rids)
            self.r.srem(self.active_key, *rids)

    def pause(self, rid: str, reason: str = "") -> Paused:
        """Hold a running run (see the module docstring); idempotent."""
        status, paused, cancelled = self._pause(
            keys=[self.run_key(rid)], args=[f"{time.time():.3f}", reason[:500]]
        )
        return Paused(rid, _shown(status, paused, cancelled))

    def resume(self, rid: str, staging: str) -> Resumed:
        """Un-pause a run: what waits is moved into `staging` (up to the cap) for the caller
        to send; the rest is released by commits as usual."""
        status, paused, cancelled, moved = self._resume(
            keys=[
                self.counters_key(rid),
                self.run_key(rid),
                self.pending_key(rid),
                staging,
                self.parked_key(rid),
            ],
            args=[f"{time.time():.3f}"],
        )
        return Resumed(rid, _shown(status, paused, cancelled), int(moved))

    def park(self, rid: str, tid: str, msg: bytes, attempt: int, counted: bool) -> int:
        """Put a task of a paused run back in its waiting list instead of running it: 1 parked,
        0 not paused any more (run it), -1 committed meanwhile. `counted`: its delivery was
        counted at begin (under `attempt`) and is taken back."""
        keys = [self.run_key(rid), self.counters_key(rid), self.pending_key(rid),
                self.ledger_key(rid), self.done_key(rid, tid),
                self.deliveries_key(tid, attempt, rid), self.parked_key(rid)]  # fmt: skip
        return int(self._park(keys=keys, args=[tid, msg, self.ttl, "1" if counted else "0"]))

    def add_dispatched(self, rid: str, step: str, n: int) -> None:
        """Count tasks about to be sent by a client (seeds, replays) before sending them."""
        if self.cluster:  # before the script: a run is never outstanding without being active
            self.r.sadd(self.active_key, rid)
        self._dispatch(
            keys=[self.counters_key(rid), self.run_key(rid), self._active(rid)], args=[rid, step, n]
        )

    def enqueue_and_release(self, rid: str, step: str, msgs: Sequence[bytes], staging: str) -> None:
        """Client-side dispatch (seeds, replays): count, queue behind the cap, release what
        fits into `staging` for the caller to send."""
        self.add_dispatched(rid, step, len(msgs))
        self.ledger_add(rid, msgs)
        if msgs:
            self.r.rpush(self.pending_key(rid), *msgs)
            self.r.expire(self.pending_key(rid), self.ttl)
        self._release(
            keys=[self.counters_key(rid), self.run_key(rid), self.pending_key(rid), staging]
        )

    def ledger_add(self, rid: str, msgs: Sequence[bytes]) -> None:
        """Record tasks a client is about to send (seeds, replays) in the run's ledger, where
        the sweeper finds them if the broker loses their message; marks progress."""
        pipe = self.r.pipeline(transaction=False)
        if msgs:
            pipe.hset(self.ledger_key(rid), mapping={orjson.loads(m)["id"]: m for m in msgs})
            pipe.expire(self.ledger_key(rid), self.ttl)
        pipe.hset(self.run_key(rid), "last", f"{time.time():.3f}")
        pipe.execute()

    def ledger(self, rid: str) -> dict[str, bytes]:
        """tid -> message of the run's tasks sent and not yet committed."""
        return {k.decode(): v for k, v in self.r.hgetall(self.ledger_key(rid)).items()}

    def waiting(self, rid: str) -> int:
        return int(self.r.llen(self.pending_key(rid)))

    def hold(self, rid: str) -> str:
        """What holds the run's tasks back: "cancelled", "paused" or "" (nothing)."""
        cancelled, paused = self.r.hmget(self.run_key(rid), "cancelled", "paused")
        return "cancelled" if cancelled else "paused" if paused else ""

    def chain_def(self, rid: str) -> bytes | None:
        return self.r.hget(self.run_key(rid), "def")

    def info(self, rid: str) -> dict[str, str]:
        return {
            k.decode(): v.decode()
            for k, v in self.r.hgetall(self.run_key(rid)).items()
            if k != b"def"
        }

    def counters(self, rid: str) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.r.hgetall(self.counters_key(rid)).items()}

    def note_resends(self, rid: str, n: int, pipe: Any) -> None:
        """The sweeper re-sent `n` of the run's tasks: counted in the run hash against the
        run's last commit (`resend_mark`), so `stalled_resends` tells re-sends that bring
        no progress (a loop) from a one-off recovery."""
        last = self.r.hmget(self.run_key(rid), "last", "resend_mark")
        stamp = last[0] or b""
        if last[1] is not None and last[1] == stamp:
            pipe.hincrby(self.run_key(rid), "resends_stalled", n)
        else:
            pipe.hset(self.run_key(rid), mapping={"resend_mark": stamp, "resends_stalled": n})

    def status(self, rid: str) -> str:
        """The run's status as shown (`run_status` with its counters; "" = no such run)."""
        return self.statuses([rid])[0]

    def statuses(self, rids: Sequence[str]) -> list[str]:
        """`status` of each run, in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for rid in rids:
            pipe.hmget(self.run_key(rid), "status", "cancelled", "paused")
            pipe.hmget(self.counters_key(rid), "items", "stored", "store_failed")
        res = pipe.execute()
        out = []
        for i in range(len(rids)):
            (status, cancelled, paused), (items, stored, failed) = res[2 * i : 2 * i + 2]
            if status is None:
                out.append("")
                continue
            info = {"status": status.decode(), "cancelled": cancelled, "paused": paused}
            c = {"items": int(items or 0), "stored": int(stored or 0),
                 "store_failed": int(failed or 0)}  # fmt: skip
            out.append(run_status(info, c))
        return out

    def storing_runs(self) -> list[str]:
        """Runs whose tasks are done and whose items still wait in the outbox; the ones
        stored meanwhile (or expired) are dropped from the set as they are met. On a cluster
        a cancelled run stays in the set (not listed) while items wait in its stream: the
        drainers read the streams of the runs in the set."""
        rids = sorted(m.decode() for m in self.r.smembers(self.storing_key))
        if not rids:
            return []
        shown = self.statuses(rids)
        keep = set(self._unstored([r for r, st in zip(rids, shown, strict=True)
                                   if st == "cancelled"])) if self.cluster else set()  # fmt: skip
        gone = [rid for rid, st in zip(rids, shown, strict=True)
                if st != "storing" and rid not in keep]  # fmt: skip
        if gone:
            self.r.srem(self.storing_key, *gone)
        return [rid for rid, st in zip(rids, shown, strict=True) if st == "storing"]

    def _unstored(self, rids: Sequence[str]) -> list[str]:
        """Those of `rids` with items not yet stored (`items` > `stored` + `store_failed`)."""
        if not rids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for rid in rids:
            pipe.hmget(self.counters_key(rid), "items", "stored", "store_failed")
        res = pipe.execute()
        return [r for r, c in zip(rids, res, strict=True)
                if not items_settled(dict(zip(("items", "stored", "store_failed"),
                                              (int(v or 0) for v in c), strict=True)))]  # fmt: skip

    def active_runs(self, chain: str | None = None) -> list[str]:
        """Run ids not yet done (of one chain if given)."""
        rids = sorted(m.decode() for m in self.r.smembers(self.active_key))
        if self.cluster and rids:  # a run whose end was not yet taken out of the set
            pipe = self.r.pipeline(transaction=False)
            for rid in rids:
                pipe.hget(self.run_key(rid), "status")
            ended = [rid for rid, st in zip(rids, pipe.execute(), strict=True)
                     if st in (b"done", b"cancelled")]  # fmt: skip
            if ended:  # its committer died before saying so
                self._ended_on_cluster(ended)
                rids = [rid for rid in rids if rid not in ended]
        if chain is None or not rids:
            return rids
        pipe = self.r.pipeline(transaction=False)
        for rid in rids:
            pipe.hget(self.run_key(rid), "chain")
        names = pipe.execute()
        return [rid for rid, c in zip(rids, names, strict=True) if c == chain.encode()]

    # task lifecycle
    def begin(self, rid: str, tid: str, retries: int) -> Begun:
        """(already committed?, deliveries of this attempt, run cancelled?) in one round trip."""
        return self.begin_many([(rid, tid, retries)])[0][0]

    def commit(
        self,
        *,
        rid: str,
        tid: str,
        step: str,
        outcome: str,
        n_items: int,
        entries: Sequence[Mapping[str, Any]],
        kids: Sequence[Kid],
        pipe_extra: Any = None,
        defer: list[CommitCall] | None = None,
        forget: Sequence[str] = (),
        counts: Mapping[tuple[str, str], int] | None = None,
    ) -> Committed | None:
        """Atomically record a finished task: the run's outstanding count and the staged
        children to send, or None if it had already committed. With `defer` the call is only
        appended there (None returned) for `run_commits`. `forget`: keys unlinked in the same
        round trip (the attempt's delivery counter, `deliv_key`). `counts`: (step, counter) ->
        n added with the commit, to the step's and the run's counter (`skipped_seen`)."""
        args: list[Any] = [tid, step, outcome, n_items, len(kids)]
        msgs = tuple(k.encode() for k in kids)
        for k, m in zip(kids, msgs, strict=True):
            args.extend((k.step, k.uniq, m))
        extra = [(s, c, n) for (s, c), n in (counts or {}).items() if n]
        args.append(len(extra))
        for s, c, n in extra:
            args.extend((s, c, n))
        call = CommitCall(rid, self.done_key(rid, tid), self.staged_at(tid, rid).key, args,
                          tuple(forget), msgs, tuple(entries))  # fmt: skip
        if defer is not None:  # the caller sends it with others: run_commits(defer)
            defer.append(call)
            return None
        return self.run_commits([call], pipe_extra=pipe_extra)[0]

    def _commit_script_call(self, rid: str, calls: Sequence[CommitCall]) -> list[Any]:
        """KEYS and ARGV of one commit script call for `calls`, all of run `rid`."""
        # without a run the run's keys are not touched: any key of the calls' slot stands in
        norun = calls[0].done_key
        keys: list[Any] = [
            self.counters_key(rid) if rid else norun,
            self.run_key(rid) if rid else norun,
            self.ks.run_outbox(rid) if self.cluster else self.outbox_key,
            self._active(rid) if rid else norun,
            self.pending_key(rid) if rid else norun,
            self.ledger_key(rid) if rid else norun,
            self._storing(rid) if rid else norun,
        ]
        groups: dict[Any, int] = {}  # entries that differ only in their items -> group number
        header: list[Any] = []
        body: list[Any] = []
        if rid:  # the run's done set and staged hash, shared by every commit
            keys += (calls[0].done_key, calls[0].staging)
        for c in calls:
            if not rid:
                keys += (c.done_key, c.staging)
            body += c.args[1:4]  # its tid is in the ids up front
            body.append(len(c.entries))
            for e in c.entries:
                items = e.get("items")
                if isinstance(items, str):
                    items = items.encode()
                if isinstance(items, bytes) and items[:1] == b"[" and items[-1:] == b"]":
                    fields = tuple((k, v) for k, v in e.items() if k != "items")
                    g = groups.get(fields)
                    if g is None:
                        g = groups[fields] = len(groups) + 1
                        header += ("m", 2 * len(fields), *(x for kv in fields for x in kv))
                    body += (g, items[1:-1])
                else:  # not a JSON array: written as it came (the drainer dead-letters it)
                    g = groups[object()] = len(groups) + 1
                    header += ("r", 2 * len(e), *(x for kv in e.items() for x in kv))
                    body += (g, "")
            body += c.args[4:]
        args: list[Any] = [rid, f"{time.time():.3f}", self.ttl, self.ks.uniq_prefix(rid),
                           len(calls), len(groups), *(c.args[0] for c in calls)]  # fmt: skip
        return [len(keys), *keys, *args, *header, *body]

    def run_commits(
        self,
        calls: Sequence[CommitCall],
        pipe_pre: Any = None,
        pipe_extra: Any = None,
    ) -> list[Committed | None]:
        """Send commit calls (from `commit(defer=...)`) in one round trip: one script call per
        run, so a batch's counters, EXPIREs and `last` are written once, summed over its
        pages, and each task id still commits at most once. `pipe_pre` adds commands before
        them, `pipe_extra` after. EVALSHA straight into the pipeline: a registered `Script`
        would make redis-py send SCRIPT EXISTS in a round trip of its own first."""
        groups: dict[str, list[int]] = {}
        for n, c in enumerate(calls):
            groups.setdefault(c.rid, []).append(n)
        pipe = self.r.pipeline(transaction=False)
        if pipe_pre is not None:
            pipe_pre(pipe)
        first = len(pipe)  # commands queued so far (a cluster pipeline keeps no command_stack)
        sha = self._commit.sha
        script_calls = [
            self._commit_script_call(rid, [calls[n] for n in idx]) for rid, idx in groups.items()
        ]
        for sc in script_calls:
            pipe.execute_command("EVALSHA", sha, *sc)  # `evalsha` is refused in cluster pipelines
        forget = [k for c in calls for k in c.forget]
        if forget and self.cluster:  # one UNLINK per key: a cluster pipeline keeps to one slot
            for k in forget:
                pipe.unlink(k)
        elif forget:
            pipe.unlink(*forget)
        if pipe_extra is not None:
            pipe_extra(pipe)
        res = pipe.execute(raise_on_error=False)
        out: list[Committed | None] = [None] * len(calls)
        ended: list[str] = []  # on a cluster: runs the scripts completed, to drop from active
        error: Exception | None = None
        for g, (idx, sc) in enumerate(zip(groups.values(), script_calls, strict=True)):
            r = res[first + g]
            if isinstance(r, redis.exceptions.NoScriptError):  # a restarted or flushed server
                self.r.script_load(self._commit.script)
                r = self.r.evalsha(sha, *sc)
            elif isinstance(r, Exception):
                error = error or r
                continue
            for n, got in zip(idx, _committed(r, [calls[n] for n in idx]), strict=True):
                out[n] = got
                if self.cluster and calls[n].rid and got is not None and got.outstanding <= 0:
                    ended.append(calls[n].rid)
        error = error or next(
            (
                r
                for r in res
                if isinstance(r, Exception) and not isinstance(r, redis.exceptions.NoScriptError)
            ),
            None,
        )
        if error is not None:
            raise error
        if self.s.redis_wait_replicas > 0:  # on a replica before anything is sent or acked
            wait_replicas(self.r, [sc[1] for sc in script_calls], self.s.redis_wait_replicas,
                          self.s.redis_wait_timeout)  # fmt: skip
        if ended:  # idempotent; lost with the process, `active_runs` moves the run later
            self._ended_on_cluster(ended)
        return out

    def begin_many(
        self, calls: Sequence[tuple[str, str, int]], batch_id: str = ""
    ) -> tuple[list[Begun], int]:
        """`begin` for several (rid, tid, retries) in one round trip (a batch's entries).

        With `batch_id`, the entries' deliveries are not counted: the batch message's are
        (the second element), and a redelivered batch runs its entries one by one, each
        counted as it starts, so a worker death is charged to the entry that was running."""
        pipe = self.r.pipeline(transaction=False)
        rids = sorted({rid for rid, _, _ in calls if rid})
        for rid in rids:
            pipe.hmget(self.run_key(rid), "cancelled", "paused", "compacted")
        # committed already? one SMISMEMBER a run (a batch's entries share a few runs)
        of_run: dict[str, list[str]] = {rid: [] for rid in rids}
        for rid, tid, _ in calls:
            if rid:
                of_run[rid].append(tid)
        for rid in rids:
            pipe.smismember(self.done_key(rid, ""), of_run[rid])
        runless = [tid for rid, tid, _ in calls if not rid]
        for tid in runless:
            pipe.exists(self.done_key("", tid))
        if batch_id:
            deliv_key = self.deliveries_key(batch_id, 0)
            pipe.incr(deliv_key)
            pipe.expire(deliv_key, DELIV_TTL)
        else:
            for rid, tid, retries in calls:
                deliv_key = self.deliveries_key(tid, retries, rid)
                pipe.incr(deliv_key)
                pipe.expire(deliv_key, DELIV_TTL)
        res = pipe.execute()
        off = len(rids)
        cancelled = {rid for rid, (c, _, _) in zip(rids, res[:off], strict=True) if c}
        paused = {rid for rid, (_, p, _) in zip(rids, res[:off], strict=True) if p}
        compacted = {rid for rid, (_, _, x) in zip(rids, res[:off], strict=True) if x}
        done: dict[tuple[str, str], bool] = {}
        for rid, flags in zip(rids, res[off : off + len(rids)], strict=True):
            done.update(((rid, t), bool(f)) for t, f in zip(of_run[rid], flags, strict=True))
        off += len(rids)
        flags = res[off : off + len(runless)]
        done.update((("", t), bool(f)) for t, f in zip(runless, flags, strict=True))
        off += len(runless)
        counts = res[off::2]  # INCR replies (EXPIRE's between them)
        begun = [
            Begun(done[(rid, tid)] or rid in compacted, 0 if batch_id else int(counts[n]),
                  rid in cancelled, rid in paused)
            for n, (rid, tid, _) in enumerate(calls)
        ]  # fmt: skip
        return begun, int(counts[0]) if batch_id else 0

    def compact(self, rid: str) -> bool:
        """Drop a finished run's per-task bookkeeping once it is complete and its items are
        stored (or refused by a sink); its hash and counters stay for the retention. False:
        not finished, items not settled, already compacted or no such run."""
        raw = self.chain_def(rid)
        steps: list[str] = []
        if raw:
            try:
                steps = list(_step_ids(orjson.loads(raw).get("root") or {}))
            except (orjson.JSONDecodeError, AttributeError, TypeError):
                steps = []
        keys = [self.run_key(rid), self.counters_key(rid), self.ks.run(rid, "done"),
                self.parked_key(rid), self.pending_key(rid), self.staged_key(rid),
                *(self.uniq_key(rid, s) for s in steps)]  # fmt: skip
        if self.cluster:  # the run's own outbox stream: every entry of it is stored
            keys.append(self.ks.run_outbox(rid))
        return bool(self._compact(keys=keys, args=[f"{time.time():.3f}", self.ttl]))

    def compact_settled(self, rids: Sequence[str]) -> list[str]:
        """`compact` those of `rids` that look settled (one pipelined read first, so a drainer
        may call this after every batch); the ones compacted now."""
        rids = [r for r in dict.fromkeys(rids) if r]
        if not rids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for rid in rids:
            pipe.hmget(self.run_key(rid), "status", "compacted")
            pipe.hmget(self.counters_key(rid), "outstanding", "items", "stored", "store_failed")
        res = pipe.execute()
        out = []
        for n, rid in enumerate(rids):
            (status, done), c = res[2 * n], [int(v or 0) for v in res[2 * n + 1]]
            if status in (b"done", b"cancelled") and not done and c[0] <= 0 \
                    and c[2] + c[3] >= c[1] and self.compact(rid):  # fmt: skip
                out.append(rid)
        return out

    def staged_kids(self, tid: str, rid: str) -> list[dict[str, Any]]:
        return [orjson.loads(m) for m in self.staged(tid, rid)]

    def clear_kids(self, tid: str, rid: str) -> None:
        """Forget what `tid` staged (sent)."""
        drop_staged(self.r, [self.staged_at(tid, rid)])

    def count_retry(self, rid: str, step: str, pipe: Any) -> None:
        if rid:
            pipe.hincrby(self.counters_key(rid), f"{step}:retried", 1)
            pipe.hincrby(self.counters_key(rid), "retried", 1)

    def reopen_failed(self, rid: str, step: str, msg: bytes | None = None) -> None:
        """A dead-lettered task is replayed: it is outstanding again and no longer failed.
        `msg` (the replayed message, `Kid.encode()` form) goes to the run's ledger."""
        if msg is not None:
            self.ledger_add(rid, [msg])
        pipe = pipeline(self.r)
        ck = self.counters_key(rid)
        pipe.hincrby(ck, f"{step}:failed", -1)
        pipe.hincrby(ck, "failed", -1)
        pipe.hincrby(ck, "outstanding", 1)
        pipe.hincrby(ck, "inflight", 1)
        pipe.hset(self.run_key(rid), "status", "running")
        pipe.hdel(self.run_key(rid), "compacted")  # its replayed task commits as usual
        pipe.sadd(self.active_key, rid)
        pipe.execute()


def stalled_resends(info: Mapping[str, Any]) -> int:
    """Tasks the sweeper re-sent since the run's last commit (from its run hash, str values):
    more than a few means re-sending brings no progress."""
    mark = info.get("resend_mark")
    if mark is None or mark != (info.get("last") or ""):
        return 0
    return int(info.get("resends_stalled") or 0)


def items_settled(counters: Mapping[str, int]) -> bool:
    """Every item the run's tasks produced reached the sinks (stored, or refused by a sink for
    good and dead-lettered in the outbox: `store_failed`)."""
    c = counters
    return int(c.get("stored", 0)) + int(c.get("store_failed", 0)) >= int(c.get("items", 0))


def _step_ids(d: Mapping[str, Any]) -> Any:
    """Step ids of a stored chain definition (`Chain.to_dict()["root"]`), depth first."""
    yield d.get("id", "")
    for c in d.get("then") or ():
        yield from _step_ids(c)


def run_status(info: Mapping[str, Any], counters: Mapping[str, int] | None = None) -> str:
    """A run's status as shown (from its run hash, str values): `cancelling` while a cancelled
    run's tasks still drain, `paused` while it is held, and with its `counters` `storing`
    while its tasks are done but items still wait in the outbox (a dead drainer's entries
    wait to be claimed): `done` only once every item is stored."""
    status = info.get("status") or "unknown"
    if status == "done" and counters is not None and not items_settled(counters):
        return "storing"
    if status != "running":
        return status
    return "cancelling" if info.get("cancelled") else "paused" if info.get("paused") else status


def _shown(status: Any, paused: Any, cancelled: Any) -> str:
    """`run_status` of a script's reply ("" = no such run)."""
    status = status.decode() if isinstance(status, bytes) else str(status or "")
    if not status:
        return ""
    return run_status({"status": status, "paused": int(paused), "cancelled": int(cancelled)})


def step_counters(counters: Mapping[str, int], steps: Sequence[str]) -> dict[str, dict[str, int]]:
    """Reshape flat `{step}:{counter}` fields into {step: {counter: n}} in chain order."""
    out = {s: dict.fromkeys(COUNTERS, 0) for s in steps}
    for k, v in counters.items():
        s, _, c = k.rpartition(":")
        if s in out and c in out[s]:
            out[s][c] = v
    return out
