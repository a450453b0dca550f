"""Acknowledging a stored batch: one Lua script per batch (`ack.lua`), and the sinks' errors.

Per entry the script XACKs, and only if XACK returned 1 (this drainer won the entry) adds the
item count to the run's counters (`{step}:stored` / `stored`, or `store_failed` for a dead
letter) and to the task and site metrics, XDELs the entry and, for a dead letter, copies it to
the dead-letter stream. Two drainers that both wrote an entry therefore count it once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis

from external_interface.storage.outbox.entries import (
    DEAD_MAXLEN,
    ENTRY_FIELDS,
    OutboxEntry,
    counters_key,
    counters_ttl,
    dead_key,
    dumps,
    errors_key,
    stream_key,
    wake_key,
)
from utils.lua import load_lua

log = logging.getLogger("external_interface.storage.outbox")

ACK = load_lua(__file__, "ack.lua")
ERROR_MAX = 2000  # characters of a sink's error kept with a dead letter or in the errors hash

# (entry, error, sink) of an entry the sinks refused for good
Dead = tuple[OutboxEntry, str, str]


def dead_fields(fields: Mapping[bytes, bytes], orig_id: str, error: str, sink: str) -> list[Any]:
    """A refused entry's dead-letter fields, flat as XADD takes them: its own entry fields,
    then where it came from, why and when (one layout for one Redis and for a cluster)."""
    extra: list[Any] = [x for k, v in fields.items() if k in ENTRY_FIELDS for x in (k, v)]
    return [
        *extra,
        "orig_id",
        orig_id,
        "error",
        error[:ERROR_MAX],
        "sink",
        sink,
        "at",
        f"{time.time():.3f}",
    ]


def ack_call(
    prefix: str, group: str, stored: Sequence[OutboxEntry], dead: Sequence[Dead]
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of `ack.lua` for a batch (layout in the script's header)."""
    keys = [stream_key(prefix), dead_key(prefix)]
    index: dict[str, int] = {}
    args: list[Any] = [group, counters_ttl(), DEAD_MAXLEN]

    def key_index(key: str) -> int:
        if key not in index:
            keys.append(key)
            index[key] = len(keys)  # Lua indexes from 1
        return index[key]

    def kidx(run: str) -> int:
        """The run's counters, followed in KEYS by its wake list (the script's layout)."""
        if not run:
            return 0
        key = counters_key(prefix, run)
        if key not in index:
            key_index(key)
            keys.append(wake_key(prefix, run))
        return index[key]

    def midx(task: str) -> list[int]:
        """Per-task and per-site metric hashes (monitor/metrics.py) count stored items."""
        if not task:
            return [0, 0]
        site = task.split(".", 1)[0]
        return [
            key_index(f"{prefix}:metrics:task:{task}"),
            key_index(f"{prefix}:metrics:site:{site}"),
        ]

    for e in stored:
        args += [e.id, kidx(e.run), e.step, len(e.items), "stored", *midx(e.task), 0]
    for e, error, sink in dead:
        extra = dead_fields(e.fields, e.id, error, sink)
        args += [
            e.id,
            kidx(e.run),
            e.step,
            len(e.items),
            "store_failed",
            *midx(e.task),
            len(extra),
            *extra,
        ]
        log.error("outbox: entry %s (%s) dead-lettered: %s", e.id, e.type, error)
    return keys, args


def note_errors(
    pipe: redis.client.Pipeline,
    prefix: str,
    consumer: str,
    failed: Mapping[str, str],
    healthy: Iterable[str],
) -> None:
    """Keep each failing sink's last error in `{prefix}:outbox:errors`; drop recovered ones."""
    ekey = errors_key(prefix)
    now = time.time()
    for name, error in failed.items():
        pipe.hset(ekey, name, dumps({"error": error[:ERROR_MAX], "at": now, "consumer": consumer}))
    ok = list(healthy)
    if ok:
        pipe.hdel(ekey, *ok)
