"""Sending tasks to the broker: child messages after a commit, seeds, re-sends.

On a Redis broker the children of a commit are LPUSHed as ready Celery protocol-2 messages in
kombu's Redis transport format, in one pipeline with the delete of their staged entries: no
`send_task`, no kombu producer per publish. Other brokers go through kombu's producer batch.
Every message names its queue explicitly (`queue_for`, the endpoint's site), so a process that
never loaded the Celery app's routes still sends each task where its workers listen.
"""

from __future__ import annotations

import base64
import math
import os
import socket
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from celery.utils.saferepr import saferepr

from config import Settings, get_settings, is_redis_url
from ledger.batching import BATCH_TASK, FANOUT_MESSAGES, Load, batch_size
from ledger.state import RunState, StagedAt, drop_staged
from utils.ids import new_id
from utils.logsafe import mask, redact, task_argsrepr
from utils.redis import get_redis
from utils.wire import PRIORITY, QUEUE


def broker_priority(prio: int, broker_url: str | None = None) -> int:
    """Our scale is 0..9 with 9 most urgent. AMQP agrees; the Redis transport pops priority 0
    first, so it gets the mirror image."""
    prio = max(0, min(9, int(prio)))
    url = broker_url or get_settings().broker_url
    return 9 - prio if is_redis_url(url) else prio


def send_kid(
    app: Any, kid: Mapping[str, Any], queue_for: Callable[[str], str], producer: Any = None
) -> None:
    """Send one task message (`Kid.encode()` form) through the app: a seed, a re-send."""
    meta = kid["meta"]
    opts: dict[str, Any] = {
        "task_id": kid["id"],
        "argsrepr": task_argsrepr(kid["params"], meta),
        "kwargsrepr": "{}",
        "queue": meta.get(QUEUE) or queue_for(kid["task"]),
    }
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
