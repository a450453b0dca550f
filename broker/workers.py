"""The task sets of the live workers, and the task ids a worker refused as unknown.

A worker knows the endpoints it imported when it started. An endpoint added (or a route
changed) while workers run is known to a fresh client process but not to them: Celery's
consumer logs `Received unregistered task` and drops the message, and without this module the
sweeper would re-send it forever while the run stays `running`. So:

- every worker publishes its registered task names and the queues it consumes at start, and
  beats every `BEAT` seconds; a worker whose `alive` key expired (`LIVE_FOR` seconds after its
  last beat, by the server's clock: machines' clocks may differ) is gone;
- `chains.run()` (and `control.sh trigger`) ask `check()` before sending: a live worker
  consuming a step's queue that lacks the step's task makes it refuse (`WorkersOutdated`);
  live workers none of which consumes a step's queue make `control.sh trigger` refuse
  (`QueuesUnserved`, unless `--wait-for-workers`; `chains.run` warns unless asked to refuse);
  with no live worker at all it only warns (workers started later load the code as it is now);
- a worker that receives a task it does not know dead-letters it (lifecycle/unknown.py) and
  marks its task id here (`mark_unknown`), so the sweeper never re-sends it.

Keys (state store, under the key prefix):
    workers:tasks      hash  worker name -> {"tasks": [...], "queues": [...], "at": time,
                             "broken": [site modules that failed to import, as dicts]}
    workers:alive:{w}  string  there while worker w beats (expires `LIVE_FOR` s after a beat)
    tasks:unknown      zset  task id -> time a worker refused it as unknown (a week kept)
    metrics:broker     hash  `unknown_tasks`: messages refused as unknown, summed
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from config import Settings, get_settings
from exceptions import QueuesUnserved, WorkersOutdated
from utils.redis import as_str
from utils.slots import lost_now

log = logging.getLogger("chaincrawl.workers")

BEAT = 10.0  # seconds between a worker's beats (its `alive` key refreshed)
ENTRY_EVERY = 6  # beats between two re-writes of its `tasks` entry while the key stays
LIVE_FOR = 45.0  # an entry not refreshed for this long is a worker that is gone
FORGET_AFTER = 3600.0  # the entry of a worker gone this long is removed
UNKNOWN_KEEP = 7 * 24 * 3600  # as long as a run record lives


@dataclass
class WorkerTasks:
    """What one live worker published."""

    name: str
    tasks: frozenset[str]
    queues: frozenset[str]  # empty: not said (taken as every queue)
    at: float
    broken: tuple[dict[str, Any], ...] = ()  # site modules it failed to import (utils/modules.py)
    started: float = 0.0  # when it loaded its code (0: not said, a worker of an older version)
    host: str = ""  # the machine it runs on (socket.gethostname())

    def consumes(self, queue: str) -> bool:
        return not self.queues or queue in self.queues


@dataclass
class Check:
    """What `TaskSets.check` found: `missing` is worker -> the needed tasks it lacks; `note`
    a warning to show (no worker up, or none consuming a queue), "" when all is well."""

    live: list[str]
    missing: dict[str, list[str]] = field(default_factory=dict)
    note: str = ""
    unserved: dict[str, list[str]] = field(default_factory=dict)  # queue -> its tasks

    def raise_if_unserved(self) -> None:
        """Workers are up, none consumes a queue of the chain: refuse (`QueuesUnserved`)."""
        if not self.unserved:
            return
        what = _queues_with_tasks(self.unserved)
        raise QueuesUnserved(
            f"no live worker consumes queue(s) {what}: restart the workers: ./control.sh "
            "restart (or trigger --wait-for-workers to send it anyway); nothing was sent",
            queues=sorted(self.unserved),
        )

    def raise_if_outdated(self) -> None:
        if not self.missing:
            return
        tasks = sorted({t for ts in self.missing.values() for t in ts})
        who = ", ".join(sorted(self.missing))
        raise WorkersOutdated(
            f"live worker(s) {who} do not know task(s) {', '.join(tasks)}: "
            f"restart the workers so they load {', '.join(tasks)} (./control.sh restart), "
            "then trigger again; nothing was sent",
            tasks=tasks,
            workers=sorted(self.missing),
        )


def _queues_with_tasks(unserved: Mapping[str, list[str]]) -> str:
    """`demo (demo.h5.feed, demo.h5.post and 3 more)`: each queue with a few of its tasks."""
    parts = []
    for q, ts in sorted(unserved.items()):
        more = f" and {len(ts) - 2} more" if len(ts) > 3 else ""
        parts.append(f"{q} ({', '.join(ts if not more else ts[:2])}{more})")
    return ", ".join(parts)


class TaskSets:
    """The registry of live workers' task sets; cheap to build, thread-safe."""

    def __init__(self, client: redis.Redis, settings: Settings | None = None) -> None:
        self.r = client
        self.s = settings or get_settings()
        self.key = self.s.key("workers", "tasks")
        self.unknown_key = self.s.key("tasks", "unknown")
        self.metrics_key = self.s.key("metrics", "broker")

    # -- the worker's side

    def alive_key(self, worker: str) -> str:
        return self.s.key("workers", "alive", worker)

    def publish(
        self,
        worker: str,
        tasks: Iterable[str],
        queues: Iterable[str] = (),
        live_for: float = LIVE_FOR,
        broken: Iterable[Mapping[str, Any]] = (),
        started: float = 0.0,
    ) -> None:
        """Say (again) which tasks `worker` knows, which queues it consumes, which site
        modules it failed to import and when and where it loaded them (`started`, by its own
        clock, and its host: `trigger` warns of a site file changed since); it counts as live
        for `live_for` seconds (by the server's clock)."""
        entry = {
            "tasks": sorted(set(tasks)),
            "queues": sorted(set(queues)),
            "at": time.time(),
            "broken": [dict(b) for b in broken],
            "started": started,
            "host": socket.gethostname(),
        }
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.key, worker, orjson.dumps(entry))
        pipe.set(self.alive_key(worker), b"1", px=max(1, int(live_for * 1000)))
        pipe.execute()

    def refresh(self, worker: str, live_for: float = LIVE_FOR) -> bool:
        """A beat between publications: `worker` stays live; -> whether its key was still
        there (False: the Redis restarted empty or was flushed, or the beats stopped too long:
        publish again)."""
        try:
            was = self.r.set(
                self.alive_key(worker), b"1", px=max(1, int(live_for * 1000)), get=True
            )
        except redis.ResponseError:  # a server before 6.2 refusing SET ... GET: publish
            return False
        return was is not None

    def leave(self, worker: str) -> None:
        """A clean shutdown: the worker no longer counts at once."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hdel(self.key, worker)
        pipe.delete(self.alive_key(worker))
        pipe.execute()

    def mark_unknown(self, tids: Iterable[str], pipe: Any = None, count: bool = True) -> None:
        """Task ids a worker refused as unknown: the sweeper leaves them alone; counted
        (unless `count` is off: `count_unknown` then, once a task)."""
        tids = [t for t in tids if t]
        if not tids:
            return
        p = pipe if pipe is not None else self.r.pipeline(transaction=False)
        now = time.time()
        p.zadd(self.unknown_key, dict.fromkeys(tids, now))
        p.zremrangebyscore(self.unknown_key, "-inf", now - UNKNOWN_KEEP)
        p.expire(self.unknown_key, UNKNOWN_KEEP)
        if count:
            self.count_unknown(len(tids), p)
        if pipe is None:
            p.execute()

    def count_unknown(self, n: int, pipe: Any) -> None:
        pipe.hincrby(self.metrics_key, "unknown_tasks", n)

    # -- the readers' side

    def unknown(self, tids: Iterable[str]) -> set[str]:
        """Those of `tids` a worker refused as unknown."""
        tids = list(tids)
        if not tids:
            return set()
        scores = self.r.zmscore(self.unknown_key, tids)
        return {t for t, sc in zip(tids, scores, strict=True) if sc is not None}

    def unknown_total(self) -> int:
        return int(self.r.hget(self.metrics_key, "unknown_tasks") or 0)

    def live(self) -> dict[str, WorkerTasks]:
        """Workers still beating; the entries of those long gone are removed."""
        entries = self.r.hgetall(self.key)
        if not entries:
            return {}
        names = sorted(entries)
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.exists(self.alive_key(as_str(name)))
        alive = pipe.execute()
        out: dict[str, WorkerTasks] = {}
        gone = []
        for name, ok in zip(names, alive, strict=True):
            try:
                d = orjson.loads(entries[name])
                w = WorkerTasks(
                    as_str(name),
                    frozenset(d["tasks"]),
                    frozenset(d.get("queues") or ()),
                    float(d["at"]),
                    tuple(d.get("broken") or ()),
                    float(d.get("started") or 0.0),
                    str(d.get("host") or ""),
                )
            except (ValueError, KeyError, TypeError):
                gone.append(name)
                continue
            if ok:
                out[w.name] = w
            elif time.time() - w.at > FORGET_AFTER:  # long gone (a worker beating again
                gone.append(name)  # meanwhile keeps its fresh entry)
        if gone:
            self.r.hdel(self.key, *gone)
        return out

    def check(self, needed: Mapping[str, str]) -> Check:
        """`needed`: task name -> the queue it is sent to. Every live worker that consumes a
        task's queue must know the task; `Check.raise_if_outdated()` refuses otherwise."""
        live = self.live()
        out = Check(live=list(live))
        if not live:
            out.note = (
                "no worker is up yet: the run is recorded and waits in the broker "
                "(./control.sh start)"
            )
            return out
        for task, queue in sorted(needed.items()):
            consumers = [w for w in live.values() if w.consumes(queue)]
            if not consumers:
                out.unserved.setdefault(queue, []).append(task)
            for w in consumers:
                if task not in w.tasks:
                    out.missing.setdefault(w.name, []).append(task)
        if out.unserved:
            what = _queues_with_tasks(out.unserved)
            out.note = (
                f"no live worker consumes queue(s) {what}: they wait until a worker "
                "does (./control.sh restart)"
            )
        return out


class Beat:
    """A worker's publication: its `alive` key refreshed every `BEAT` seconds in a daemon
    thread, the `tasks` entry re-written every `ENTRY_EVERY` beats (its `at` only tells a
    worker long gone) and whenever the key was found gone."""

    def __init__(
        self,
        sets: TaskSets,
        worker: str,
        tasks: Iterable[str],
        queues: Iterable[str],
        broken: Iterable[Mapping[str, Any]] = (),
    ):
        self.sets, self.worker = sets, worker
        self.tasks, self.queues = sorted(set(tasks)), sorted(set(queues))
        self.broken = [dict(b) for b in broken]
        self.started = time.time()  # built as the worker is ready: its code is loaded
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._publish()
        self._thread = threading.Thread(target=self._loop, name="task-set-beat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        beats = 0
        while not self._stop.wait(BEAT):
            beats += 1
            try:  # the entry every ENTRY_EVERY beats, or at once when the key was gone
                if beats % ENTRY_EVERY == 0 or not self.sets.refresh(self.worker):
                    self._publish()
            except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
                if lost_now(self.sets.r, exc):  # its key on a lost slot range: said once
                    log.debug("publishing this worker's task set failed: %s", exc)
                    continue  # by the task that parks a message (lifecycle/lost.py)
                log.warning("publishing this worker's task set failed: %s", exc)

    def _publish(self) -> None:
        self.sets.publish(
            self.worker, self.tasks, self.queues, broken=self.broken, started=self.started
        )

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
            self._thread = None
        with contextlib.suppress(redis.RedisError):  # Redis down: the entry expires
            self.sets.leave(self.worker)
