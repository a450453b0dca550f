"""Runs as records: creating one, listing, reading its hash and counters, its status as
shown, and the global sets of active and storing runs."""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any, cast

import orjson
from redis.cluster import RedisCluster

from exceptions import ParamsError
from ledger.keys import RunKeys
from ledger.records import RECENT_KEEP, items_settled, run_status
from utils.redis import as_str, pipeline
from utils.slots import lost_for, lost_ranges

RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""What a run id may hold: it sits in the keys' `{...}` hash tag and in file names."""


class Runs(RunKeys):
    """Runs as records: created, listed, read, counted by clients, moved between the global
    sets."""

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
        masters = [n.name for n in cast(RedisCluster, self.r).get_primaries()]
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
        return str(cast(RedisCluster, self.r).get_node_from_key(self.run_key(rid)).name)

    def create_run(
        self, rid: str, chain_name: str, chain_json: bytes, priority: int, cap: int = 0
    ) -> None:
        """Record a run. `cap` bounds the run's tasks in the broker at once (0 = no bound);
        children beyond it wait in `run:{rid}:pending` and are released as tasks finish.
        A run id names one run: an id already recorded is a `ParamsError` and the run it
        names is left as it is (reopening a finished run would leave it never ending)."""
        if not RUN_ID.fullmatch(rid):
            raise ParamsError(
                f"run_id {rid!r}: letters, digits, '_', '-' and '.' only, at most 64 characters"
            )
        now = f"{time.time():.3f}"
        if not self.r.hsetnx(self.run_key(rid), "created", now):
            status = as_str(self.r.hget(self.run_key(rid), "status") or b"?")
            raise ParamsError(
                f"run_id {rid!r} is taken by a run ({status}): give a new id, or leave run_id "
                "out for a fresh one (chains.get_run gives a handle on the existing run)"
            )
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
            as_str(m) for m in self.r.zrevrange(self.recent_key, offset, offset + max(0, limit - 1))
        ]
        if not rids:
            return []
        ranges = lost_ranges(self.r)  # a run on a lost slot range counts as alive (unread)
        read = [rid for rid in rids if not lost_for(ranges, self.run_key(rid))]
        pipe = self.r.pipeline(transaction=False)
        for rid in read:
            pipe.exists(self.run_key(rid))
        alive = dict(zip(read, pipe.execute() if read else [], strict=True))
        gone = [rid for rid, ok in alive.items() if not ok]
        if gone:
            self.r.zrem(self.recent_key, *gone)
        return [rid for rid in rids if alive.get(rid, True)]

    def _ended_on_cluster(self, rids: Sequence[str]) -> None:
        """On a cluster the scripts cannot reach the global sets: runs they ended move from
        `runs:active` to `runs:storing` here (the drainers read the streams of storing runs;
        `storing_runs` drops the stored ones). Storing first: a crash in between leaves a run
        in both sets, which the readers settle, never in neither."""
        rids = list(dict.fromkeys(rids))
        if rids:
            self.r.sadd(self.storing_key, *rids)
            self.r.srem(self.active_key, *rids)

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
        if msgs:  # the push, then `nowait` dropped (commit.lua: nothing waits while it is set)
            pipe = self.r.pipeline(transaction=False)
            pipe.rpush(self.pending_key(rid), *msgs)
            pipe.expire(self.pending_key(rid), self.ttl)
            pipe.hdel(self.run_key(rid), "nowait")
            pipe.execute()
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
        ledger = cast("dict[bytes, bytes]", self.r.hgetall(self.ledger_key(rid)))
        return {as_str(k): v for k, v in ledger.items()}

    def waiting(self, rid: str) -> int:
        return int(self.r.llen(self.pending_key(rid)))

    def hold(self, rid: str) -> str:
        """What holds the run's tasks back: "cancelled", "paused" or "" (nothing)."""
        cancelled, paused = self.r.hmget(self.run_key(rid), "cancelled", "paused")
        return "cancelled" if cancelled else "paused" if paused else ""

    def chain_def(self, rid: str) -> bytes | None:
        return cast("bytes | None", self.r.hget(self.run_key(rid), "def"))

    def info(self, rid: str) -> dict[str, str]:
        return {
            as_str(k): as_str(v)
            for k, v in self.r.hgetall(self.run_key(rid)).items()
            if k != b"def"
        }

    def counters(self, rid: str) -> dict[str, int]:
        return {as_str(k): int(v) for k, v in self.r.hgetall(self.counters_key(rid)).items()}

    def watch(self, rid: str, seconds: float) -> None:
        """A progress view follows the run for the next `seconds`: until then the commit
        script pushes 'p' to its wake list on every commit, not only when it ends. Written
        only on a run that exists (its hash is never recreated without its expiry)."""
        until = f"{time.time() + seconds:.3f}"
        pipe = pipeline(self.r)
        pipe.exists(self.run_key(rid))
        pipe.hset(self.run_key(rid), "watch", until)
        if not pipe.execute()[0]:
            self.r.delete(self.run_key(rid))  # a run gone meanwhile: no stray hash

    def next_wake(self, rid: str, timeout: float) -> bytes | None:
        """Block until the run's scripts push to its wake list (utils/wake.lua) or
        `timeout` seconds pass: b"e" (it may have ended), b"p" (it moved), None."""
        got = cast(
            "tuple[bytes, bytes] | None",
            self.r.blpop([self.wake_key(rid)], timeout=max(0.01, timeout)),
        )
        return got[1] if got else None

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
            c = {
                "items": int(items or 0),
                "stored": int(stored or 0),
                "store_failed": int(failed or 0),
            }
            out.append(run_status(info, c))
        return out

    def storing_runs(self) -> list[str]:
        """Runs whose tasks are done and whose items still wait in the outbox; the ones
        stored meanwhile (or expired) are dropped from the set as they are met. On a cluster
        a cancelled run stays in the set (not listed) while items wait in its stream: the
        drainers read the streams of the runs in the set."""
        rids = sorted(as_str(m) for m in self.r.smembers(self.storing_key))
        if not rids:
            return []
        shown = self.statuses(rids)
        keep = (
            set(self._unstored([r for r, st in zip(rids, shown, strict=True) if st == "cancelled"]))
            if self.cluster
            else set()
        )
        gone = [
            rid for rid, st in zip(rids, shown, strict=True) if st != "storing" and rid not in keep
        ]
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
        return [
            r
            for r, c in zip(rids, res, strict=True)
            if not items_settled(
                dict(
                    zip(("items", "stored", "store_failed"), (int(v or 0) for v in c), strict=True)
                )
            )
        ]

    def active_runs(self, chain: str | None = None) -> list[str]:
        """Run ids not yet done (of one chain if given)."""
        rids = sorted(as_str(m) for m in self.r.smembers(self.active_key))
        if self.cluster and rids:  # a run whose end was not yet taken out of the set
            pipe = self.r.pipeline(transaction=False)
            for rid in rids:
                pipe.hget(self.run_key(rid), "status")
            ended = [
                rid
                for rid, st in zip(rids, pipe.execute(), strict=True)
                if st in (b"done", b"cancelled")
            ]
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
