"""Outbox entries: the stream's keys, the producer side (the fields of one entry), and an
entry as the drainer reads it.

A task's commit XADDs one entry per item type with the fields `outbox_entry_fields` builds;
the commits of a batch sent in one script call share it (one entry holds the items of every
fresh commit of the call whose fields but `items` are alike: run, step, endpoint, type,
key). `OutboxEntry.parse` reads them back and turns a malformed entry into one that goes
straight to the dead letters.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from config import get_settings
from external_interface.storage.sinks.base import Origin
from utils.keyspace import Keyspace
from utils.redis import as_str
from utils.wire import OutboxFields

GROUP = "sinks"


def counters_ttl() -> int:
    """The life of a run's counters an acknowledgement re-creates (the run's had expired): the
    run records' own, `CHAINCRAWL_RUN_RETENTION`."""
    return get_settings().run_retention


DEAD_MAXLEN = 100_000


def stream_key(prefix: str) -> str:
    return Keyspace(prefix).outbox


def dead_key(prefix: str) -> str:
    return Keyspace(prefix).outbox_dead


def errors_key(prefix: str) -> str:
    return Keyspace(prefix).outbox_errors


def counters_key(prefix: str, run: str) -> str:
    return Keyspace(prefix).counters(run)


def wake_key(prefix: str, run: str) -> str:
    """The run's wake list, pushed when its last items settle (`RunHandle.wait()`)."""
    return Keyspace(prefix).wake(run)


# --- the producer side ---------------------------------------------------------------------


def dumps(value: Any) -> bytes:
    """JSON as the drainer reads it (non-string keys allowed)."""
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def outbox_entry_fields(
    run: str,
    step: str,
    task: str,
    type: str,
    key_fields: Sequence[str],
    items: Sequence[Mapping[str, Any]],
    dedup: Any = None,
) -> dict[str, str | bytes]:
    """The fields of one outbox entry exactly as the drainer expects them (utils/wire.py:
    the commit's entries are the same codec's)."""
    return OutboxFields.of(run, step, task, type, key_fields, items, dedup).encode()


def xadd_entry(
    client: redis.Redis,
    prefix: str,
    type: str,
    key_fields: Sequence[str],
    items: Sequence[Mapping[str, Any]],
    *,
    run: str = "",
    step: str = "",
    task: str = "",
    dedup: Any = None,
) -> str:
    """XADD one entry (tests, scripts; the core adds entries inside its commit script)."""
    fields = outbox_entry_fields(run, step, task, type, key_fields, items, dedup)
    return as_str(client.xadd(stream_key(prefix), fields))  # type: ignore[arg-type]


# --- entries ---------------------------------------------------------------------------------


@dataclass
class OutboxEntry:
    id: str
    fields: dict[bytes, bytes]
    run: str = ""
    step: str = ""
    task: str = ""
    type: str = ""
    key_fields: list[str] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)
    dedup: Any = None
    error: str = ""  # set when the entry cannot be parsed: it goes straight to dead letters

    @classmethod
    def parse(cls, entry_id: bytes | str, fields: Mapping[bytes, bytes]) -> OutboxEntry:
        raw = {k if isinstance(k, bytes) else str(k).encode(): v for k, v in fields.items()}
        f = {as_str(k): v for k, v in raw.items()}
        e = cls(
            as_str(entry_id),
            raw,
            as_str(f.get("run")),
            as_str(f.get("step")),
            as_str(f.get("task")),
        )
        e.type = as_str(f.get("type"))
        try:
            e.key_fields = [str(k) for k in orjson.loads(f.get("key") or b"[]")]
            e.items = orjson.loads(f.get("items") or b"[]")
            if f.get("dedup"):
                e.dedup = orjson.loads(f["dedup"])
            if not e.type or not isinstance(e.items, list):
                raise ValueError("no type" if not e.type else "items is not a list")
            if not all(isinstance(i, dict) for i in e.items):
                raise ValueError("an item is not an object")
        except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
            e.error = f"malformed outbox entry: {exc}"
            e.items = []
        return e

    @property
    def origin(self) -> Origin:
        return Origin(self.id, self.run, self.step, self.task)


# the fields of an entry that a dead letter keeps (so `requeue_dead` can restore the entry)
ENTRY_FIELDS = (b"run", b"step", b"task", b"type", b"key", b"items", b"dedup")


def default_consumer() -> str:
    """host:pid:thread, unique per drainer thread (a restarted process gets a new name)."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()}"


def merge_new(buffer: list[OutboxEntry], new: Iterable[OutboxEntry]) -> list[OutboxEntry]:
    """Append to `buffer` the entries whose id it does not hold yet; -> `buffer`.

    A drainer must never hold one entry twice: its own XAUTOCLAIM hands back the entries it
    holds once they have been idle for `claim_idle` (after a Redis error), and a batch with
    an entry twice would write its items twice
    (test_entries_claimed_back_after_a_redis_error_are_held_once)."""
    held = {e.id for e in buffer}
    for e in new:
        if e.id not in held:
            held.add(e.id)
            buffer.append(e)
    return buffer
