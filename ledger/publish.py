"""Sending tasks to the broker: child messages after a commit, seeds, re-sends.

On a Redis broker the children of a commit are LPUSHed as ready Celery protocol-2 messages in
kombu's Redis transport format, in one pipeline with the delete of their staged entries: no
`send_task`, no kombu producer per publish. Other brokers go through kombu's producer batch.
Every message names its queue explicitly (`queue_for`, the endpoint's site), so a process that
never loaded the Celery app's routes still sends each task where its workers listen.

How many pages go in one message (`batch_size`, below): a message costs its consumer about 1-3
ms of CPU whatever it carries, so a deep backlog is sent as batches (`chaincrawl.batch` messages
of up to `CHAINCRAWL_BATCH` pages). A shallow one is not: every worker slot needs a message of
its own to stay busy, and where a batch runs its pages one after the other (threads, prefork) k
pages in one slot cost k latencies. `Load` is what the heuristics read of the process: its
slots, how busy its CPU is, and whether a batch's pages run side by side (gevent).
docs/performance.md has the measurements behind the constants.
"""

from __future__ import annotations

import base64
import math
import os
import socket
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from celery.utils.saferepr import saferepr

from config import Settings, get_settings, is_redis_url
from ledger.state import RunState, StagedAt, drop_staged
from utils.logsafe import mask, redact, task_argsrepr
from utils.process import gevent_patched, new_id
from utils.redis import get_redis
from utils.wire import PRIORITY, QUEUE

BATCH_TASK = "chaincrawl.batch"  # args = [entries], each entry a `Kid.encode()` dict

# threads/prefork: below this share of a core wanted, one page per message. The CPU is to
# spare then, and a batch runs its pages one after the other in one slot (k pages = k
# latencies), which left slots idle in the tail of a latency-bound run. Not lower: a
# latency-bound crawl parses its 16 responses together every 250 ms, and on the threads pool
# one 0.1 s window read 0.5-0.6; batched then, a user's ten posts ran one after the other in
# one slot and made a 2.5 s tail. A CPU-bound crawl reads 0.95 and more from its first 20 ms.
# (Smoothing the share over windows instead delayed the first batches of a CPU-bound crawl and
# cost it 30 % CPU per page: the first publishes decide whether their subtrees run batched.)
BATCH_CPU_MIN = 0.75
# gevent: one publish's children of one destination go in at most this many messages
# (`Publisher.plan`), however shallow the backlog. Their pages run side by side, so a batch
# costs no latency, while a message costs its consumer ~1-3 ms of CPU. Four, not one: a second
# worker (a second core, in a CPU-bound crawl) still gets its share of a small fan-out.
FANOUT_MESSAGES = 4
BATCH_SLOT_FACTOR = 2  # messages per worker slot the backlog must still make when batched
BATCH_CPU_BOUND = 0.85  # share of a core wanted recently from which the worker is CPU-bound
CPU_WINDOW = 0.1  # seconds over which `Load.busy` measures
DEFAULT_SLOTS = 16  # a process that is not a worker (a client, a test) sizes for this


# -- how much of a core this process wants (what `Load.busy` reads) ---------------------------
# The CPU share alone cannot tell "latency-bound" from "CPU-bound on a shared machine": two
# workers on two cores, beside Redis and the page server, each got 0.6-0.8 of a core, read as
# latency-bound, sent four times the messages per page and paid twice the CPU per page for them
# (the scaling benchmark: 1 worker 1.76 ms/page, 2 workers 3.5). Linux counts the time a thread
# was runnable but waited on a run queue (`run_delay`, second field of
# `/proc/<pid>/task/<tid>/schedstat`, CONFIG_SCHED_INFO); CPU + wait is what the process would
# have used with a core of its own. Where the kernel does not say, the wait reads 0 and the
# meter is the plain CPU share.
TASKS = "/proc/self/task"


def run_queue_wait() -> float | None:
    """Seconds all live threads of this process have waited for a CPU so far, or None where
    the kernel does not count it. Threads that exited take their share with them (callers
    clamp a negative delta), which is why this is only read over short windows."""
    total = 0
    try:
        tids = os.listdir(TASKS)
    except OSError:
        return None
    seen = False
    for tid in tids:
        try:
            with open(f"{TASKS}/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
            seen = True
        except (OSError, IndexError, ValueError):
            continue  # the thread exited between the listing and the read
    return total / 1e9 if seen else None


class CpuMeter:
    """Share of one core this process wanted over the last `window` seconds (all threads).

    Read often (every page ticks it): within 1/5 of a window a new burst shows (a CPU-bound
    crawl's first publishes decide whether its subtrees run batched), and a window spanning
    an idle spell reads 0 (it says nothing about the burst starting now). The run-queue wait
    is read only when a window rolls (a file per thread) and added to the CPU share until the
    next roll."""

    def __init__(
        self,
        window: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.process_time,
        waited: Callable[[], float | None] = run_queue_wait,
    ) -> None:
        self.window = window
        self._clock, self._cpu, self._waited = clock, cpu, waited
        self._start = self._cpu_start = 0.0
        self._wait_start: float | None = None
        self.cpu_share = 0.0  # CPU used over the last (or current) window, in cores
        self.wait_share = 0.0  # run-queue wait over the last full window, in cores
        self._last = 0.0
        self._read = 0.0  # when the window so far was last read
        self._lock = threading.Lock()

    def demand(self) -> float:
        """CPU share + run-queue wait share: near 1 for a CPU-bound single-threaded worker
        whatever else runs on its cores, well below 1 for a latency-bound one. Threads that
        find another one updating the window get the last reading: unlocked, a thread that
        read the clocks just before another rolled the window computed shares below zero
        (the threads pool then fell back to one page per message a third of the time)."""
        if not self._lock.acquire(blocking=False):
            return self._last
        try:
            now = self._clock()
            span = now - self._start
            if span >= self.window:  # roll the window
                cpu, waited = self._cpu(), self._waited()
                fresh = span < 5 * self.window
                self.cpu_share = (cpu - self._cpu_start) / span if fresh else 0.0
                prev = self._wait_start
                self.wait_share = (
                    max(0.0, waited - prev) / span
                    if fresh and waited is not None and prev is not None
                    else 0.0
                )
                self._start, self._cpu_start, self._wait_start = now, cpu, waited
            elif span >= self.window / 5 and now - self._read >= self.window / 20:
                # the window so far, read at most every 1/20 of a window: the process's CPU
                # clock is a system call summing every thread (a page asks several times)
                self.cpu_share = (self._cpu() - self._cpu_start) / span
                self._read = now
            self._last = self.cpu_share + self.wait_share
            return self._last
        finally:
            self._lock.release()


class Load:
    """The process as batching sees it. Workers size it at start (`slots`: the pool's
    concurrency); every page ticks `busy()` so it is fresh whenever a publish asks (asked only
    by publishes, it went stale between the few pages with children, read 0 on a CPU-bound
    crawl and left it at one page per message: 3.3 ms instead of 1.4 per page)."""

    def __init__(
        self,
        slots: int = 0,
        busy: Callable[[], float] | None = None,
        side_by_side: Callable[[], bool] = gevent_patched,
    ) -> None:
        self.slots = max(1, int(slots)) if slots else DEFAULT_SLOTS
        self._meter = CpuMeter(CPU_WINDOW)
        self.busy: Callable[[], float] = busy or self._meter.demand
        self.side_by_side = side_by_side

    def tail_backlog(self) -> int:
        """Below this many outstanding tasks a run is in its tail: tasks write the pending
        metrics with their commit, so a finished run's metrics are complete."""
        return max(64, 2 * self.slots)


def batch_size(s: Settings, outstanding: int, load: Load, cpu_floor: bool = True) -> int:
    """Pages per message for children of a run with `outstanding` tasks.

    With `CHAINCRAWL_BATCH_BACKLOG` set: `batch` from that backlog on, else 1. Auto (0): the
    backlog must still make enough messages to keep the worker busy — two per slot (every slot
    needs work; ramp-up and tail stay one page per message; a second worker gets its share), a
    quarter of that (at least 4) once it is CPU-bound (more messages would not add throughput,
    only per-message cost).

    Where a batch runs its pages one after the other (threads, prefork), also one page per
    message while the worker wants less than 3/4 of a core (latency-bound: the CPU is to spare,
    and k pages in one slot cost k latencies; skipped with `cpu_floor=False`). Under gevent a
    batch runs its pages side by side, so latency-bound workers batch too, and slots beyond
    2 x `batch` count no further (one message keeps up to `batch` of them busy)."""
    size = max(1, s.batch)
    if size == 1:
        return 1
    if s.batch_backlog > 0:
        return size if outstanding >= s.batch_backlog else 1
    busy = load.busy()
    side_by_side = load.side_by_side()
    if cpu_floor and busy < BATCH_CPU_MIN and not side_by_side:
        return 1
    slots = load.slots
    if side_by_side:  # one message can keep up to `batch` slots busy
        slots = min(slots, BATCH_SLOT_FACTOR * size)
    wanted = BATCH_SLOT_FACTOR * slots
    if busy >= BATCH_CPU_BOUND:
        wanted = max(4, wanted // 4)
    return max(1, min(size, outstanding // wanted))


def broker_priority(prio: int, broker_url: str | None = None) -> int:
    """Our scale is 0..9 with 9 most urgent. AMQP agrees; the Redis transport pops priority 0
    first, so it gets the mirror image."""
    prio = max(0, min(9, int(prio)))
    url = broker_url or get_settings().broker_url
    return 9 - prio if is_redis_url(url) else prio


def send_kid(
    app: Any,
    kid: Mapping[str, Any],
    queue_for: Callable[[str], str],
    producer: Any = None,
    *,
    redelivered: bool = False,
) -> None:
    """Send one task message (`Kid.encode()` form) through the app: a seed, a re-send.

    `redelivered`: the message is flagged as the broker flags a restored one, so its begin
    looks up the run's done set (a first delivery does not: lifecycle/page.py). The sweeper's
    re-sends are, since a task it thought lost may have committed meanwhile."""
    meta = kid["meta"]
    opts: dict[str, Any] = {
        "task_id": kid["id"],
        "argsrepr": task_argsrepr(kid["params"], meta),
        "kwargsrepr": "{}",
        "queue": meta.get(QUEUE) or queue_for(kid["task"]),
    }
    if redelivered:  # a message property: kombu's Redis transport keeps it, Celery reads it
        opts["delivery_info"] = {"redelivered": True}
    if PRIORITY in meta:
        opts["priority"] = broker_priority(meta[PRIORITY])
    if producer is not None:
        opts["producer"] = producer
    app.send_task(kid["task"], args=(kid["params"], meta), **opts)


@dataclass
class Message:
    task: str
    id: str
    args: list[Any]
    queue: str
    priority: int | None
    argsrepr: str


class Publisher:
    """Sends committed children. On a Redis broker they are LPUSHed as ready Celery
    protocol-2 messages in kombu's Redis transport format, all in one pipeline together with
    the delete of their staged entries: no `send_task`, no kombu client per publish, no task-sent
    event. Other brokers go through kombu's producer batch."""

    def __init__(
        self, app: Any, s: Settings, queue_for: Callable[[str], str], load: Load | None = None
    ) -> None:
        self.app = app
        self.s = s
        self.queue_for = queue_for  # task name -> its queue (the endpoint's site)
        self.load = load or Load()
        self.redis_broker = s.redis_broker
        opts = app.conf.broker_transport_options or {}
        self.prefix = opts.get("global_keyprefix", "")
        self.sep = opts.get("sep", "\x06\x16")
        self.steps = sorted(opts.get("priority_steps") or (0, 3, 6, 9))
        self.origin = f"gen{os.getpid()}@{socket.gethostname()}"

    def plan(
        self, kids: list[dict[str, Any]], outstanding: int, spread: bool = True
    ) -> list[Message]:
        """The children of one (task, queue, priority) in messages of up to `batch_size`
        entries, evenly filled; one message per child when that is 1. Under gevent (and
        `spread`) a group also goes in at most `FANOUT_MESSAGES` messages, `batch` allowing."""
        size = batch_size(self.s, outstanding, self.load) if len(kids) > 1 else 1
        fan = spread and self.s.batch > 1 and self.s.batch_backlog <= 0 and self.load.side_by_side()
        groups: dict[tuple[str, str, int | None], list[dict[str, Any]]] = {}
        for kid in kids:
            meta = kid["meta"]
            prio = broker_priority(meta[PRIORITY], self.s.broker_url) if PRIORITY in meta else None
            dest = (kid["task"], meta.get(QUEUE) or self.queue_for(kid["task"]), prio)
            groups.setdefault(dest, []).append(kid)
        out: list[Message] = []
        for (task, queue, prio), group in groups.items():
            per = size
            if fan and len(group) > FANOUT_MESSAGES:
                per = max(size, min(self.s.batch, math.ceil(len(group) / FANOUT_MESSAGES)))
            n_msgs = math.ceil(len(group) / per) if per > 1 else len(group)
            q, r = divmod(len(group), n_msgs)  # even sizes: 10 in 4 -> 3, 3, 2, 2
            start = 0
            for j in range(n_msgs):
                chunk = group[start : start + q + (j < r)]
                start += len(chunk)
                if len(chunk) == 1:
                    k = chunk[0]
                    args = [k["params"], k["meta"]]
                    rep = task_argsrepr(k["params"], k["meta"])
                    out.append(Message(task, k["id"], args, queue, prio, rep))
                else:
                    rep = batch_argsrepr(chunk)
                    out.append(Message(BATCH_TASK, new_id(), [chunk], queue, prio, rep))
        return out

    def publish(
        self,
        state: RunState,
        groups: Sequence[tuple[list[bytes], StagedAt]],
        outstanding: int,
        front: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Send the staged children of `groups` ((messages, where they are staged)), then
        drop them from there. Anything raised leaves them staged for a redelivery to send. `front`:
        entries a batch did not start, due already, so on a Redis broker they go to the head
        of their queues (the next BRPOP takes them) instead of behind the whole backlog."""
        ats = [at for staged, at in groups if staged]
        # orjson, not TaskEnvelope.decode: a batch sends these dicts as they are, no copy each
        kids = [orjson.loads(m) for staged, _ in groups for m in staged]
        if not kids and not front:
            return
        msgs = self.plan(kids, outstanding)
        first = self.plan(list(front), outstanding, spread=False)  # as a batch hands them out
        if self.redis_broker:
            broker = get_redis(self.s.broker_url)
            pipe = broker.pipeline(transaction=False)
            for m in msgs:
                pipe.lpush(*self.envelope(m))
            for m in reversed(first):  # the head is the right end: keep their order
                pipe.rpush(*self.envelope(m))
            same = self.s.broker_url == self.s.redis_url
            if same and ats:
                drop_staged(pipe, ats)
            pipe.execute()
            if not same and ats:
                drop_staged(state.r, ats)
            return
        with self.app.producer_or_acquire() as producer, producer.batch():
            for m in first + msgs:
                opts: dict[str, Any] = {"queue": m.queue}
                if m.priority is not None:
                    opts["priority"] = m.priority
                self.app.send_task(
                    m.task,
                    args=m.args,
                    task_id=m.id,
                    argsrepr=m.argsrepr,
                    kwargsrepr="{}",
                    producer=producer,
                    **opts,
                )
        if ats:
            drop_staged(state.r, ats)

    def envelope(self, m: Message) -> tuple[str, bytes]:
        """(queue key, message) as kombu's Redis transport LPUSHes a Celery protocol-2 task."""
        body = orjson.dumps(
            [m.args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
        )
        pri = m.priority or 0
        msg = {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {
                "lang": "py",
                "task": m.task,
                "id": m.id,
                "shadow": None,
                "eta": None,
                "expires": None,
                "group": None,
                "group_index": None,
                "retries": 0,
                "timelimit": [None, None],
                "root_id": m.id,
                "parent_id": None,
                "argsrepr": m.argsrepr,
                "kwargsrepr": "{}",
                "origin": self.origin,
                "ignore_result": True,
                "replaced_task_nesting": 0,
                "stamped_headers": None,
                "stamps": {},
            },
            "properties": {
                "correlation_id": m.id,
                "reply_to": "",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": m.queue},
                "priority": pri,
                "body_encoding": "base64",
                "delivery_tag": new_id(),
            },
        }
        step = self.steps[bisect_right(self.steps, pri) - 1] if self.steps else 0
        queue = f"{m.queue}{self.sep}{step}" if step else m.queue
        return f"{self.prefix}{queue}", orjson.dumps(msg)


def batch_argsrepr(chunk: list[dict[str, Any]]) -> str:
    """What Flower shows of a batch message: its size and its first page, masked. Masking and
    repr-ing every entry cost more than building the message (each entry's own events, when
    on, show its arguments)."""
    first = chunk[0]
    head = redact(
        saferepr(mask({"id": first["id"], "params": first["params"], "meta": first["meta"]}), 512)
    )
    return f"[{len(chunk)} pages of {first['task']}: {head}, ...]"
