"""Outbox entries: the stream's keys, the producer side (the fields of one entry), an entry as
the drainer reads it, and its acknowledgement.

A task's commit XADDs one entry per item type with the fields `outbox_entry_fields` builds;
the commits of a batch sent in one script call share it (one entry holds the items of every
fresh commit of the call whose fields but `items` are alike: run, step, endpoint, type,
key). `OutboxEntry.parse` reads them back and turns a malformed entry into one that goes
straight to the dead letters.

The drainer's blocking reads (`BlockingReader`) go through a connection of their own, which a
stop can end at once: an idle drainer blocks on XREADGROUP for up to `MAX_IDLE_BLOCK` seconds
(drainer.py), and a warm shutdown must not wait that out. The connection's Redis client id is
known (`CLIENT ID`, asked once per socket), and `unblock()` ends the read in flight from
another connection (`CLIENT UNBLOCK`): Redis answers it as a timeout, so nothing is read and
nothing is left pending (the id and the retries are utils/redis.py's, as for kombu's BRPOP).

Acknowledging a stored batch (`ack_call`): one Lua script per batch (`ack.lua`), and the sinks'
errors (`note_errors`).

Per entry the script XACKs, and only if XACK returned 1 (this drainer won the entry) adds the
item count to the run's counters (`{step}:stored` / `stored`, or `store_failed` for a dead
letter) and to the task and site metrics, XDELs the entry and, for a dead letter, copies it to
the dead-letter stream. Two drainers that both wrote an entry therefore count it once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from config import get_settings
from external_interface.storage.sinks.base import Origin
from utils.keyspace import Keyspace
from utils.lua import load_lua
from utils.redis import as_str, known_client_id, socket_client_id, unblock_client
from utils.wire import OutboxFields

GROUP = "sinks"
log = logging.getLogger("external_interface.storage.outbox")


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


LAST_WAVE = 16  # tasks left: a run's last wave of pages (the slots of one worker)
LAST_WAVE_GATHER = 0.005  # seconds a drainer gathers entries of runs in their last wave


def tasks_left(r: redis.Redis, prefix: str, entries: Sequence[OutboxEntry]) -> int | None:
    """The most tasks any run of `entries` has outstanding; None for a runless entry, a run
    without counters, or when Redis cannot say."""
    runs = list(dict.fromkeys(e.run for e in entries))
    if not runs or "" in runs:
        return None
    pipe = r.pipeline(transaction=False)
    for run in runs:
        pipe.hget(counters_key(prefix, run), "outstanding")
    try:
        left = pipe.execute()
    except redis.RedisError:
        return None
    return None if any(v is None for v in left) else max(int(v) for v in left)


def tasks_done(r: redis.Redis, prefix: str, entries: Sequence[OutboxEntry]) -> bool:
    """Whether every run of `entries` has no task left outstanding: no more entries will come
    for them, so a drainer stores its partial batch now instead of waiting out its idle flush
    (a small run's last items, and with them its end, a window sooner). False for a runless
    entry or when Redis cannot say: the batch then waits as before."""
    left = tasks_left(r, prefix, entries)
    return left is not None and left <= 0


def gather_window(left: int | None, idle_flush: float) -> float:
    """How long a drainer holding entries lets the next ones gather: `idle_flush`, or
    LAST_WAVE_GATHER once every run it read has at most LAST_WAVE tasks left (`left`). The
    commit that ends a run wakes the drainer of its own process at once
    (utils/process.py); one in another process holding the run's earlier items learns of
    the end at its next read, so in a run's last wave it reads again soon."""
    if left is not None and left <= LAST_WAVE:
        return min(idle_flush, LAST_WAVE_GATHER)
    return idle_flush


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


# -- reading: the drainer's blocking reads ------------------------------------------------


class BlockingReader:
    """`xreadgroup` through a connection of its own (taken from `client`'s pool); `unblock()`
    from any other thread ends a blocked one. A client without a pool (a cluster, a fake)
    reads through `client` itself, and `unblock()` does nothing."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._own: redis.Redis | None = None
        self._reading = threading.Event()
        self.stopping = False  # set by unblock(): a read that starts now does not block

    def xreadgroup(self, *args: Any, **kw: Any) -> Any:
        conn = self._connection()
        if conn is None:
            return self.client.xreadgroup(*args, **kw)
        self._reading.set()
        try:
            if self.stopping and kw.get("block"):
                kw["block"] = 1
            return conn.xreadgroup(*args, **kw)
        finally:
            self._reading.clear()

    def _connection(self) -> redis.Redis | None:
        pool = getattr(self.client, "connection_pool", None)
        if not isinstance(pool, redis.ConnectionPool):
            return None
        if self._own is None:
            self._own = redis.Redis(connection_pool=pool, single_connection_client=True)
        own = self._own.connection
        if own is None:
            return None
        socket_client_id(own, "the outbox drainer's reads block briefly")
        return self._own

    @property
    def unblockable(self) -> bool:
        """Whether a long block can be ended by `unblock()` (else the drainer keeps it short)."""
        return self._cid() is not None

    def _cid(self) -> int | None:
        """The reading connection's client id, if known for its current socket."""
        return known_client_id(getattr(self._own, "connection", None))

    def longest(self, wanted: float, short: float) -> float:
        """The longest block to ask for: `wanted` once `unblock()` can end it, else `short`;
        under two thirds of the connection's socket timeout either way (a block the socket
        outwaits would fail as a timeout)."""
        block = wanted if self.unblockable else short
        conn = getattr(self._own, "connection", None)
        timeout = getattr(conn, "socket_timeout", None)
        return min(block, 2 * timeout / 3) if timeout else block

    def unblock(self) -> bool:
        """End the read in flight, if any (-> whether one was ended), and keep the reads
        that follow from blocking (`stopping`); a read about to block is unblocked again
        until it returns."""
        self.stopping = True
        cid = self._cid()
        if cid is None or not self._reading.is_set():
            return False

        def still_blocked(wait: float) -> bool:  # the read has not returned after `wait`
            time.sleep(wait)
            return self._reading.is_set()

        try:
            return unblock_client(self.client, cid, still_blocked)
        except redis.RedisError as exc:  # Redis down: the read ends with its own error
            log.debug("outbox drainer: read not unblocked: %s", exc)
        return False

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None


# -- acknowledging a batch ---------------------------------------------------------------------

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
    prefix: str,
    group: str,
    stored: Sequence[OutboxEntry],
    dead: Sequence[Dead],
    *,
    keys: Sequence[str] | None = None,
    run_keys: Callable[[str], tuple[str, str] | None] | None = None,
    metrics: bool = True,
    entry_id: Callable[[OutboxEntry], str] = lambda e: e.id,
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of `ack.lua` for a batch read from one stream (layout in the script's
    header). The defaults are one Redis's; a cluster's drainer (cluster.py) passes a run's
    stream and its dead letters as `keys`, `run_keys(run)` the run's counters and wake list
    (None: the entry is counted in no run), `metrics=False` (the per-task and per-site
    hashes are on other slots: counted beside the call) and `entry_id`, the entry's id in
    its stream. One builder: the script reads one layout."""
    out = list(keys) if keys is not None else [stream_key(prefix), dead_key(prefix)]
    index: dict[str, int] = {}
    args: list[Any] = [group, counters_ttl(), DEAD_MAXLEN]

    def key_index(key: str) -> int:
        if key not in index:
            out.append(key)
            index[key] = len(out)  # Lua indexes from 1
        return index[key]

    def kidx(run: str) -> int:
        """The run's counters, followed in KEYS by its wake list (the script's layout)."""
        if not run:
            return 0
        pair = run_keys(run) if run_keys else (counters_key(prefix, run), wake_key(prefix, run))
        if pair is None:
            return 0
        counters, wake = pair
        if counters not in index:
            key_index(counters)
            out.append(wake)
        return index[counters]

    def midx(task: str) -> list[int]:
        """Per-task and per-site metric hashes (monitor/metrics.py) count stored items."""
        if not task or not metrics:
            return [0, 0]
        site = task.split(".", 1)[0]
        return [
            key_index(f"{prefix}:metrics:task:{task}"),
            key_index(f"{prefix}:metrics:site:{site}"),
        ]

    for e in stored:
        args += [entry_id(e), kidx(e.run), e.step, len(e.items), "stored", *midx(e.task), 0]
    for e, error, sink in dead:
        extra = dead_fields(e.fields, entry_id(e), error, sink)
        args += [
            entry_id(e),
            kidx(e.run),
            e.step,
            len(e.items),
            "store_failed",
            *midx(e.task),
            len(extra),
            *extra,
        ]
        log.error("outbox: entry %s (%s) dead-lettered: %s", e.id, e.type, error)
    return out, args


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
