"""The outbox drainer: moves committed items from the Redis stream `{prefix}:outbox` to the sinks.

A task's commit script XADDs one entry per (task attempt, item type) — fields built by
`outbox_entry_fields`. Drainers read the stream as consumers of the group "sinks" (one drainer
thread per worker process, or `python -m external_interface.outbox`) and, for each batch:

1. group the entries by item type and write every type to all of its sinks (idempotent writes);
2. after *all* of a type's sinks confirmed, call the `on_stored` hooks (dedup marks items there);
3. in one Lua script per batch, per entry: `XACK`; only if XACK returned 1 (this drainer won the
   entry), add the item count to `run:{run}:counters` (`{step}:stored` and `stored`) and XDEL
   the entry. Two drainers that both wrote an entry therefore count it exactly once.

Batches flush by size (`outbox_batch`), by time (`outbox_flush_interval` after the first entry
arrived), when the stream goes quiet (`outbox_idle_flush` without a new entry: a run's last items
are stored at once) and on shutdown. An entry is acknowledged only after it is stored, so nothing
is lost when a drainer dies: its entries stay pending and another drainer claims them
(XAUTOCLAIM) once they have been idle for `claim_idle` seconds.

Sink outages: the failed entries stay pending, the drainer stops reading new ones and retries
with exponential backoff (refreshing its claim so others don't steal them); everything newer
waits in the stream. A sink's last error is kept in `{prefix}:outbox:errors` until it recovers.

Poison entries: when a sink raises `PermanentSinkError` (the data itself is refused), the type's
entries are retried one by one and the ones still refused go to `{prefix}:outbox:dead` with the
error, acknowledged, and counted as `{step}:store_failed` / `store_failed` instead of `stored`.
`requeue_dead()` puts them back.

Trimming: acknowledged entries are deleted (XDEL) by the script that acknowledged them, so the
stream only ever holds entries not yet stored: `XLEN` *is* the backlog, and its first entry is
the oldest one that can still be delivered (the *horizon* the JSONL sink uses to bound its
memory of written entries). XTRIM MINID was the alternative; it needs the group's pending
minimum and last-delivered id to be safe and leaves stored entries around until the next trim.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import redis

from external_interface.storage import (
    Origin,
    PermanentSinkError,
    Sink,
    SinkRouter,
    build_sinks,
    entry_version,
    env_float,
)

if TYPE_CHECKING:
    from config import Settings

log = logging.getLogger(__name__)

GROUP = "sinks"
COUNTERS_TTL = 7 * 24 * 3600  # like the run records: counters we create never outlive a week
DEAD_MAXLEN = 100_000
MAX_BLOCK = 0.5  # seconds one XREADGROUP may block

StoredHook = Callable[[str, list[dict[str, Any]]], None]
on_stored: list[StoredHook] = []  # called with (item_type, items) after all sinks confirmed


def stream_key(prefix: str) -> str:
    return f"{prefix}:outbox"


def dead_key(prefix: str) -> str:
    return f"{prefix}:outbox:dead"


def errors_key(prefix: str) -> str:
    return f"{prefix}:outbox:errors"


def counters_key(prefix: str, run: str) -> str:
    return f"{prefix}:run:{run}:counters"


# --- the producer side ---------------------------------------------------------------------


def _dumps(value: Any) -> bytes:
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
    """The fields of one outbox entry exactly as the drainer expects them."""
    fields: dict[str, str | bytes] = {
        "run": run or "",
        "step": step or "",
        "task": task,
        "type": type,
        "key": _dumps(list(key_fields)),
        "items": _dumps(list(items)),
    }
    if dedup is not None:
        fields["dedup"] = _dumps(dedup)
    return fields


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
    return _s(client.xadd(stream_key(prefix), fields))  # type: ignore[arg-type]


# --- entries ---------------------------------------------------------------------------------


def _s(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


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
        f = {_s(k): v for k, v in raw.items()}
        e = cls(_s(entry_id), raw, _s(f.get("run")), _s(f.get("step")), _s(f.get("task")))
        e.type = _s(f.get("type"))
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


# --- the acknowledgement script ----------------------------------------------------------------

_ACK = """
-- KEYS: 1 stream, 2 dead-letter stream, 3.. counters hashes
-- ARGV: 1 group, 2 counters ttl, 3 dead maxlen, then per entry:
--       id, counters key index (0: no run), step, n items, counter field,
--       task metrics key index, site metrics key index, n dead fields, fields...
local group, ttl, maxlen = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local i, won = 4, 0
-- counts are summed per key and field and written once per call (a drain's entries share a
-- few runs and endpoints): key index -> {field -> n}, key indexes in first-seen order
local sums, order, runs = {}, {}, {}
local function add(idx, field, n)
  local t = sums[idx]
  if t == nil then t = {}; sums[idx] = t; order[#order + 1] = idx end
  t[field] = (t[field] or 0) + n
end
while i <= #ARGV do
  local id, kidx, step, n, cfield = ARGV[i], tonumber(ARGV[i+1]), ARGV[i+2],
    tonumber(ARGV[i+3]), ARGV[i+4]
  local tidx, sidx, nf = tonumber(ARGV[i+5]), tonumber(ARGV[i+6]), tonumber(ARGV[i+7])
  local first = i + 8
  i = first + nf
  if redis.call('XACK', KEYS[1], group, id) == 1 then
    won = won + 1
    redis.call('XDEL', KEYS[1], id)
    if nf > 0 then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', unpack(ARGV, first, first + nf - 1))
    end
    if kidx > 0 and n > 0 then
      runs[kidx] = true
      add(kidx, step .. ':' .. cfield, n)
      add(kidx, cfield, n)
    end
    if n > 0 and tidx > 0 then
      add(tidx, cfield, n)
      add(sidx, cfield, n)
    end
  end
end
for _, idx in ipairs(order) do
  local key = KEYS[idx]
  local fresh = runs[idx] and redis.call('EXISTS', key) == 0  -- a run's counters outlived
  for field, n in pairs(sums[idx]) do redis.call('HINCRBY', key, field, n) end
  if fresh then redis.call('EXPIRE', key, ttl) end
end
return won
"""

_REQUEUE = """
-- KEYS: 1 outbox, 2 dead stream, 3 counters (or the outbox again when there is no run)
-- ARGV: 1 dead id, 2 step, 3 n, 4.. original fields
if redis.call('XDEL', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
local n = tonumber(ARGV[3])
if KEYS[3] ~= KEYS[1] and n > 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[2] .. ':store_failed', -n)
  redis.call('HINCRBY', KEYS[3], 'store_failed', -n)
end
return 1
"""

# XAUTOCLAIM ... JUSTID through a script: redis-py's reply parser would drop the cursor.
_AUTOCLAIM = """
return redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4],
                  'COUNT', ARGV[5], 'JUSTID')
"""

_ENTRY_FIELDS = (b"run", b"step", b"task", b"type", b"key", b"items", b"dedup")


def default_consumer() -> str:
    """host:pid:thread, unique per drainer thread (a restarted process gets a new name)."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()}"


def _merge(buffer: list[OutboxEntry], new: Iterable[OutboxEntry]) -> list[OutboxEntry]:
    """Append to `buffer` the entries whose id it does not hold yet; -> `buffer`.

    A drainer must never hold one entry twice: its own XAUTOCLAIM hands back the entries it
    holds once they have been idle for `claim_idle` (after a Redis error, bug 2), and a batch
    with an entry twice would write its items twice."""
    held = {e.id for e in buffer}
    for e in new:
        if e.id not in held:
            held.add(e.id)
            buffer.append(e)
    return buffer


# --- the drainer -------------------------------------------------------------------------------


class Drainer:
    """Reads the outbox as one consumer of the group and writes batches to the sinks."""

    def __init__(
        self,
        redis_client: redis.Redis,
        prefix: str,
        sinks: SinkRouter | Sequence[Sink],
        batch: int = 500,
        interval: float = 0.5,
        *,
        idle_flush: float = 0.05,
        group: str = GROUP,
        consumer: str | None = None,
        claim_idle: float = 60.0,
        claim_every: float | None = None,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        shutdown_timeout: float = 10.0,
        hooks: Iterable[StoredHook] | None = None,
        own_sinks: bool = False,
    ) -> None:
        self.r = redis_client
        self.prefix = prefix
        self.router = sinks if isinstance(sinks, SinkRouter) else SinkRouter(list(sinks))
        self.batch = max(1, batch)
        self.interval = max(0.001, interval)
        self.idle_flush = max(0.0, idle_flush)
        self.group = group
        self.consumer = consumer or ""
        self.claim_idle = claim_idle
        self.claim_every = claim_every if claim_every is not None else max(0.2, claim_idle / 4)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.shutdown_timeout = shutdown_timeout
        self.hooks = list(hooks) if hooks is not None else on_stored  # module list by default
        self.own_sinks = own_sinks
        self.stream = stream_key(prefix)
        self._ack = self.r.register_script(_ACK)
        self._autoclaim = self.r.register_script(_AUTOCLAIM)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = {"stored": 0, "dead": 0, "failures": 0, "claimed": 0}

    @classmethod
    def from_settings(
        cls, settings: Settings | None = None, sinks: SinkRouter | None = None, **kw: Any
    ) -> Drainer:
        from config import get_settings
        from utils.redis import get_redis

        settings = settings or get_settings()
        kw.setdefault("claim_idle", env_float("CHAINCRAWL_OUTBOX_CLAIM_IDLE", 60.0))
        kw.setdefault("max_backoff", env_float("CHAINCRAWL_OUTBOX_MAX_BACKOFF", 30.0))
        return cls(
            get_redis(settings.redis_url),
            settings.key_prefix,
            sinks or build_sinks(settings),
            settings.outbox_batch,
            settings.outbox_flush_interval,
            idle_flush=settings.outbox_idle_flush,
            own_sinks=sinks is None,
            **kw,
        )

    # --- lifecycle ---------------------------------------------------------------------------

    def start_thread(self, name: str = "outbox-drainer") -> threading.Thread:
        """Run in a daemon thread (one per worker process); `stop()` flushes and joins it."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, args=(self._stop,), name=name, daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else self.shutdown_timeout + 30)
            self._thread = None

    def run(self, stop: threading.Event | None = None) -> None:
        """Drain until `stop` is set, then flush what was read and return."""
        stop = stop or self._stop
        self.consumer = self.consumer or default_consumer()
        buffer: list[OutboxEntry] = []
        first_at = 0.0
        retrying = 0  # consecutive failed flushes of `buffer` (a sink is down)
        errors = 0  # consecutive other errors (Redis down, bugs)
        started = False
        next_claim = next_horizon = 0.0
        log.info("outbox drainer %s started on %s", self.consumer, self.stream)
        try:
            while not stop.is_set():
                try:
                    if not started:  # in the loop: Redis may be down when the worker starts
                        self.ensure_group()
                        buffer = self.own_pending()
                        first_at = time.monotonic()
                        started = True
                    now = time.monotonic()
                    if now >= next_horizon:
                        self.update_horizon(buffer)
                        next_horizon = now + 5.0
                    if not retrying and now >= next_claim and len(buffer) < self.batch:
                        claimed = self.claim(self.batch - len(buffer))
                        next_claim = now + self.claim_every
                        if claimed and not buffer:
                            first_at = now
                        # XAUTOCLAIM also returns our own idle entries: after a Redis error
                        # the ones we already hold come back (bug 2); keep each id once
                        _merge(buffer, claimed)
                    quiet = False
                    if not retrying and len(buffer) < self.batch:
                        # short blocks: stop() is noticed quickly, socket timeouts never hit
                        wait = self.interval - (now - first_at) if buffer else self.interval
                        wait = min(wait, MAX_BLOCK)
                        if buffer and self.idle_flush:
                            wait = min(wait, self.idle_flush)
                        new = self.read(self.batch - len(buffer), max(1, int(wait * 1000)))
                        # nothing more came for `idle_flush`: the writers paused or the run
                        # ended; store now rather than hold its last items for `interval`
                        quiet = bool(buffer) and not new and self.idle_flush > 0
                        if new and not buffer:
                            first_at = time.monotonic()
                        _merge(buffer, new)
                    due = quiet or time.monotonic() - first_at >= self.interval
                    if buffer and (len(buffer) >= self.batch or due or retrying):
                        buffer = self.flush(buffer)
                        if buffer:
                            retrying += 1
                            self.heartbeat(buffer)
                            stop.wait(self._delay(retrying))
                        else:
                            retrying = 0
                    errors = 0
                except Exception as e:  # nothing may silently end storage for this process
                    errors += 1
                    if isinstance(e, redis.RedisError):
                        log.warning("outbox drainer: redis error %s; retrying", e)
                    else:
                        log.exception("outbox drainer: unexpected error; retrying")
                    if buffer:  # keep our claim on what we hold while we back off
                        self.heartbeat(buffer)
                    stop.wait(self._delay(errors))
            if started:
                self._shutdown_flush(buffer)
        finally:
            if self.own_sinks:
                self.router.close()
            log.info("outbox drainer %s stopped", self.consumer)

    def _delay(self, failures: int) -> float:
        base = min(self.max_backoff, self.backoff * 2 ** min(failures - 1, 30))
        return base * (0.5 + random.random() / 2)

    def _shutdown_flush(self, buffer: list[OutboxEntry]) -> None:
        """Store the last partial batch; what still fails stays pending for another drainer."""
        deadline = time.monotonic() + self.shutdown_timeout
        attempt = 0
        while buffer:
            try:
                buffer = self.flush(buffer)
            except redis.RedisError as e:
                log.warning("outbox drainer: redis error at shutdown: %s", e)
            attempt += 1
            delay = self._delay(attempt)
            if not buffer or time.monotonic() + delay > deadline:
                break
            time.sleep(delay)
        if buffer:
            log.warning("outbox drainer: %d entries left pending at shutdown", len(buffer))
            return
        try:  # tidy XINFO CONSUMERS: a consumer without pending entries is not needed any more
            if not self.r.xpending_range(
                self.stream, self.group, "-", "+", 1, consumername=self.consumer
            ):
                self.r.xgroup_delconsumer(self.stream, self.group, self.consumer)
        except redis.RedisError:
            pass

    def drain_once(self, claim: bool = False) -> int:
        """Store everything readable now (scripts, tests). -> entries acknowledged."""
        self.consumer = self.consumer or default_consumer()
        self.ensure_group()
        self.update_horizon()
        before = self.stats["stored"] + self.stats["dead"]
        buffer = self.own_pending()
        if claim:
            _merge(buffer, self.claim(self.batch))
        while True:
            if len(buffer) < self.batch:
                _merge(buffer, self.read(self.batch - len(buffer), None))
            if not buffer:
                break
            left = self.flush(buffer)
            if left:
                break  # a sink is down: the rest stays pending
            buffer = []
        return self.stats["stored"] + self.stats["dead"] - before

    # --- reading -----------------------------------------------------------------------------

    def ensure_group(self) -> None:
        try:
            self.r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def read(self, count: int, block_ms: int | None) -> list[OutboxEntry]:
        try:
            resp = self.r.xreadgroup(
                self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms
            )
        except redis.ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            self.ensure_group()  # the stream was deleted under us
            return []
        return self._entries(resp)

    def own_pending(self) -> list[OutboxEntry]:
        """Entries this consumer name read but never acknowledged (a previous life)."""
        resp = self.r.xreadgroup(self.group, self.consumer, {self.stream: "0"}, count=self.batch)
        return self._entries(resp)

    def _entries(self, resp: Any) -> list[OutboxEntry]:
        if isinstance(resp, dict):  # RESP3
            resp = list(resp.items())
        out, gone = [], []
        for _stream, messages in resp or []:
            for entry_id, fields in messages:
                if fields:
                    out.append(OutboxEntry.parse(entry_id, fields))
                elif entry_id is not None:
                    gone.append(_s(entry_id))
        if gone:
            self.r.xack(self.stream, self.group, *gone)  # deleted while pending: nothing to store
        return out

    def claim(self, count: int) -> list[OutboxEntry]:
        """Take over entries another consumer left pending for `claim_idle` seconds."""
        ids: list[str] = []
        cursor = "0-0"
        for _ in range(10):
            resp = self._autoclaim(
                keys=[self.stream],
                args=[
                    self.group,
                    self.consumer,
                    int(self.claim_idle * 1000),
                    cursor,
                    count - len(ids),
                ],
            )
            cursor = _s(resp[0])
            ids += [_s(i) for i in resp[1]]
            if cursor == "0-0" or len(ids) >= count:
                break
        if not ids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for i in ids:
            pipe.xrange(self.stream, i, i)
        found = pipe.execute()
        out, gone = [], []
        for i, rows in zip(ids, found, strict=True):
            if rows:
                out.append(OutboxEntry.parse(rows[0][0], rows[0][1]))
            else:
                gone.append(i)
        if gone:
            self.r.xack(self.stream, self.group, *gone)
        if out:
            log.info("outbox drainer %s claimed %d idle entries", self.consumer, len(out))
            self.stats["claimed"] += len(out)
        return out

    def heartbeat(self, entries: Sequence[OutboxEntry]) -> None:
        """Reset the idle time of entries we keep retrying, so no one claims them meanwhile."""
        with contextlib.suppress(redis.RedisError):
            self.r.xclaim(
                self.stream, self.group, self.consumer, 0, [e.id for e in entries], justid=True
            )

    def update_horizon(self, held: Sequence[OutboxEntry] = ()) -> None:
        """Tell sinks the oldest entry id that can still be delivered (see module docstring).

        That includes the entries this drainer holds: after a Redis error it retries its
        buffer, whose entries may have been acknowledged and deleted already (the reply to the
        ack script was lost). A sink that forgot them would write them a second time (bug 2)."""
        targets = [s for s in self.router.all() if hasattr(s, "horizon")]
        if not targets:
            return
        first = self.r.xrange(self.stream, "-", "+", count=1)
        if first:
            horizon = _s(first[0][0])
        else:
            try:
                horizon = _s(self.r.xinfo_stream(self.stream)["last-generated-id"])
            except redis.ResponseError:  # no stream yet
                return
        if held:
            oldest = min((e.id for e in held), key=entry_version)
            if entry_version(oldest) < entry_version(horizon):
                horizon = oldest
        for sink in targets:
            try:
                sink.horizon(horizon)  # type: ignore[attr-defined]
            except Exception:
                log.exception("sink %s: horizon update failed", sink.name)

    # --- writing -----------------------------------------------------------------------------

    def flush(self, entries: Sequence[OutboxEntry]) -> list[OutboxEntry]:
        """Write, hook, acknowledge and count. -> the entries to retry later (sink down).

        Each entry id is written once per batch even if a caller passed it twice: the JSONL
        sink only skips entries committed by *earlier* writes (bug 2)."""
        groups: dict[tuple[str, tuple[str, ...]], list[OutboxEntry]] = {}
        dead: list[tuple[OutboxEntry, str, str]] = []
        for e in _merge([], entries):
            if e.error:
                dead.append((e, e.error, ""))
            else:
                groups.setdefault((e.type, tuple(e.key_fields)), []).append(e)
        failed: dict[str, str] = {}
        healthy: set[str] = set()
        stored: list[tuple[str, list[OutboxEntry]]] = []
        retry: list[OutboxEntry] = []
        for (item_type, key_fields), group in groups.items():
            err = self._write(item_type, list(key_fields), group, failed, healthy)
            if err is None:
                stored.append((item_type, group))
            elif not isinstance(err, PermanentSinkError):
                retry += group
            else:  # isolate the entry the data error belongs to
                for e in group:
                    err1 = (
                        err
                        if len(group) == 1
                        else self._write(item_type, list(key_fields), [e], failed, healthy)
                    )
                    if err1 is None:
                        stored.append((item_type, [e]))
                    elif isinstance(err1, PermanentSinkError):
                        dead.append((e, str(err1), err1.sink))
                    else:
                        retry.append(e)
        acked: list[OutboxEntry] = []
        for item_type, group in stored:
            try:
                self._run_hooks(item_type, group)
                acked += group
                if self.hooks:
                    healthy.add("on_stored")
            except Exception as e:
                log.exception("outbox: on_stored hook failed for %s; will retry", item_type)
                failed["on_stored"] = f"{type(e).__name__}: {e}"
                retry += group
        self._acknowledge(acked, dead, failed, healthy - set(failed))
        if retry:
            self.stats["failures"] += 1
        return retry

    def _write(
        self,
        item_type: str,
        key_fields: list[str],
        entries: Sequence[OutboxEntry],
        failed: dict[str, str],
        healthy: set[str],
    ) -> Exception | None:
        items: list[dict[str, Any]] = []
        origins: list[Origin] = []
        for e in entries:
            items += e.items
            origins += [e.origin] * len(e.items)
        if not items:
            return None
        error: Exception | None = None
        try:
            targets = self.router.for_type(item_type)
        except Exception as e:  # routing names a sink that was not built: configuration
            failed["router"] = str(e)
            return e
        healthy.add("router")
        for sink in targets:  # every sink gets its chance, even after another failed
            try:
                sink.write(item_type, key_fields, items, origins=origins)
                healthy.add(sink.name)
            except Exception as e:
                failed[sink.name] = f"{type(e).__name__}: {e}"
                log.warning(
                    "sink %s failed on %d %s items: %s", sink.name, len(items), item_type, e
                )
                if error is None or isinstance(e, PermanentSinkError):
                    error = e
        return error

    def _run_hooks(self, item_type: str, entries: Sequence[OutboxEntry]) -> None:
        if not self.hooks:
            return
        items = [i for e in entries for i in e.items]
        for hook in self.hooks:
            hook(item_type, items)

    def _acknowledge(
        self,
        stored: Sequence[OutboxEntry],
        dead: Sequence[tuple[OutboxEntry, str, str]],
        failed: Mapping[str, str],
        healthy: Iterable[str],
    ) -> None:
        keys = [self.stream, dead_key(self.prefix)]
        index: dict[str, int] = {}
        args: list[Any] = [self.group, COUNTERS_TTL, DEAD_MAXLEN]

        def key_index(key: str) -> int:
            if key not in index:
                keys.append(key)
                index[key] = len(keys)  # Lua indexes from 1
            return index[key]

        def kidx(run: str) -> int:
            return key_index(counters_key(self.prefix, run)) if run else 0

        def midx(task: str) -> list[int]:
            """Per-task and per-site metric hashes (monitor/metrics.py) count stored items."""
            if not task:
                return [0, 0]
            site = task.split(".", 1)[0]
            return [
                key_index(f"{self.prefix}:metrics:task:{task}"),
                key_index(f"{self.prefix}:metrics:site:{site}"),
            ]

        for e in stored:
            args += [e.id, kidx(e.run), e.step, len(e.items), "stored", *midx(e.task), 0]
        for e, error, sink in dead:
            extra: list[Any] = []
            for k, v in e.fields.items():
                if k in _ENTRY_FIELDS:
                    extra += [k, v]
            extra += [
                "orig_id",
                e.id,
                "error",
                error[:2000],
                "sink",
                sink,
                "at",
                f"{time.time():.3f}",
            ]
            args += [e.id, kidx(e.run), e.step, len(e.items), "store_failed", *midx(e.task),
                     len(extra), *extra]  # fmt: skip
            log.error("outbox: entry %s (%s) dead-lettered: %s", e.id, e.type, error)
        pipe = self.r.pipeline(transaction=False)
        if stored or dead:
            self._ack(keys=keys, args=args, client=pipe)
        ekey = errors_key(self.prefix)
        now = time.time()
        for name, error in failed.items():
            pipe.hset(
                ekey, name, _dumps({"error": error[:2000], "at": now, "consumer": self.consumer})
            )
        ok = list(healthy)
        if ok:
            pipe.hdel(ekey, *ok)
        if len(pipe):
            pipe.execute()
        self.stats["stored"] += len(stored)
        self.stats["dead"] += len(dead)

    def backlog(self) -> dict[str, Any]:
        return backlog(self.r, self.prefix, self.group)


# --- status and maintenance ------------------------------------------------------------------


def _age(entry_id: str | None, now_ms: int) -> float | None:
    if not entry_id:
        return None
    return max(0.0, (now_ms - int(entry_id.split("-")[0])) / 1000)


def backlog(client: redis.Redis, prefix: str | Settings, group: str = GROUP) -> dict[str, Any]:
    """What waits for storage: for `control.sh status` and tests (`prefix` or the settings).

    `length` counts entries not yet stored (stored ones are deleted); `pending` of them were
    read by a drainer that has not confirmed them; `undelivered` were never read.
    """
    if not isinstance(prefix, str):
        prefix = prefix.key_prefix
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
        "oldest_pending_age": _age(_s(pending.get("min")), now_ms) if n_pending else None,
        "oldest_entry_age": _age(_s(first[0][0]), now_ms) if first else None,
        "consumers": {_s(c["name"]): int(c["pending"]) for c in pending.get("consumers") or []},
        "dead": int(dead),
        "errors": {_s(k): orjson.loads(v) for k, v in errors.items()},
    }


def requeue_dead(client: redis.Redis, prefix: str, count: int | None = None) -> int:
    """Move dead-lettered entries back into the outbox (after fixing the sink or the data)."""
    script = client.register_script(_REQUEUE)
    rows = client.xrange(dead_key(prefix), "-", "+", count=count)
    moved = 0
    for dead_id, fields in rows:
        original: list[Any] = []
        for k in _ENTRY_FIELDS:
            if k in fields:
                original += [k, fields[k]]
        e = OutboxEntry.parse(fields.get(b"orig_id", b"0-0"), fields)
        ck = counters_key(prefix, e.run) if e.run else stream_key(prefix)
        moved += int(
            script(
                keys=[stream_key(prefix), dead_key(prefix), ck],
                args=[dead_id, e.step, len(e.items), *original],
            )
        )
    return moved


# --- standalone process --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m external_interface.outbox`: a drainer process; SIGTERM flushes and exits."""
    from config import get_settings
    from utils.redis import get_redis

    p = argparse.ArgumentParser(
        prog="python -m external_interface.outbox", description=__doc__.split("\n")[0]
    )
    p.add_argument("--status", action="store_true", help="print the backlog as JSON and exit")
    p.add_argument("--once", action="store_true", help="drain what is there now, then exit")
    p.add_argument("--requeue-dead", action="store_true", help="move dead letters back and exit")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--interval", type=float, default=None)
    p.add_argument("--claim-idle", type=float, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("CHAINCRAWL_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = get_settings()
    if args.status:
        r = get_redis(settings.redis_url)
        sys.stdout.write(
            orjson.dumps(backlog(r, settings.key_prefix), option=orjson.OPT_INDENT_2).decode()
            + "\n"
        )
        return 0
    if args.requeue_dead:
        print(requeue_dead(get_redis(settings.redis_url), settings.key_prefix))
        return 0
    kw: dict[str, Any] = {}
    if args.claim_idle is not None:
        kw["claim_idle"] = args.claim_idle
    drainer = Drainer.from_settings(settings, **kw)
    if args.batch:
        drainer.batch = args.batch
    if args.interval:
        drainer.interval = args.interval
    if args.once:
        try:
            n = drainer.drain_once(claim=True)
        finally:
            drainer.router.close()
        print(n)
        return 0
    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: flushing and stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    drainer.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
