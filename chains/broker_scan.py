"""What the Redis broker holds, by task id: the sweeper's look for a run's lost messages
(chains/sweeper.py). kombu keeps a queued message in a list (one per queue and priority) and a
delivered, unacknowledged one in the `unacked` hash; a `chaincrawl.batch` message carries the
ids of its entries in its body.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import orjson
import redis

from ledger.publish import BATCH_TASK
from utils.wire import envelope_id

_CHUNK = 1000


def message_ids(raw: Any) -> list[str]:
    """Task ids carried by one raw broker message: a queue entry (the kombu envelope as JSON)
    or an `unacked` value (`[envelope, exchange, routing_key]`). The header `id`, and for a
    `chaincrawl.batch` message also the `id` of every entry of its body (`[args, kwargs,
    embed]`, args[0] the entries). Anything unreadable gives what could be read (or [])."""
    try:
        msg = orjson.loads(raw) if isinstance(raw, bytes | bytearray | memoryview | str) else raw
        if isinstance(msg, list):  # an `unacked` value
            msg = msg[0] if msg else None
        if not isinstance(msg, Mapping):
            return []
        headers = msg.get("headers") or {}
        ids = [str(headers["id"])] if headers.get("id") else []
        if headers.get("task") == BATCH_TASK:
            ids += _batch_ids(msg)
        return ids
    except (ValueError, TypeError, KeyError, AttributeError):
        return []


def _batch_ids(msg: Mapping[str, Any]) -> list[str]:
    try:
        body: Any = msg.get("body")
        if (msg.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = orjson.loads(body)[0]
        entries = args[0] if args else []
        return [str(e["id"]) for e in entries if type(e) is dict and e.get("id")]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return []


def broker_task_ids(
    client: redis.Redis,
    keyprefix: str,
    stale_after: float | None = None,
    stale_ids: set[str] | None = None,
    tick: Callable[[], None] | None = None,
) -> set[str]:
    """Every task id in the Redis broker under `keyprefix` (kombu's `global_keyprefix`): all
    lists (queues and their priority sub-queues, whatever the separator) and `unacked`.

    With `stale_after`, an `unacked` message delivered longer ago than that (its
    `unacked_index` score) does not count: kombu restores every message after the visibility
    timeout, so one still there long after means its restore sweeps are not running (a
    backstop; a task re-queueing itself, once taken for such a message, sends a fresh
    message every time). Re-sending it is safe: the commit runs once per task id. The ids of
    such messages go to `stale_ids` when given. `tick()` is called after each chunk read (a
    long read keeps its caller's lock with it)."""
    ids: set[str] = set()
    stale: set[bytes] = set()
    if stale_after is not None:
        cutoff = time.time() - stale_after
        stale = set(
            cast("list[bytes]", client.zrangebyscore(f"{keyprefix}unacked_index", "-inf", cutoff))
        )
    for key in client.scan_iter(match=f"{keyprefix}*", count=1000, _type="list"):
        start = 0
        while True:
            chunk = client.lrange(key, start, start + _CHUNK - 1)
            for raw in chunk:
                ids.update(message_ids(raw))
            if tick is not None:
                tick()
            if len(chunk) < _CHUNK:
                break
            start += _CHUNK
    for n, (tag, raw) in enumerate(client.hscan_iter(f"{keyprefix}unacked", count=1000)):
        if tag not in stale:
            ids.update(message_ids(raw))
        elif stale_ids is not None:
            stale_ids.update(message_ids(raw))
        if tick is not None and n % _CHUNK == _CHUNK - 1:
            tick()
    return ids


def kid_id(raw: bytes | str) -> list[str]:
    try:
        tid = envelope_id(raw.encode() if isinstance(raw, str) else raw)
    except ValueError:  # WireError: not a task message
        return []
    return [tid] if tid else []
