"""The drainer: reads the outbox stream as one consumer of the group "sinks" and writes
batches to the sinks (one drainer thread per worker process, or `python -m
external_interface.storage.outbox`). The package docstring tells the whole protocol.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import redis

from config import Settings, get_settings
from external_interface.storage.outbox.entries import (
    ACK,
    GROUP,
    BlockingReader,
    Dead,
    OutboxEntry,
    ack_call,
    default_consumer,
    gather_window,
    merge_new,
    note_errors,
    stream_key,
    tasks_left,
)
from external_interface.storage.outbox.listeners import (
    EntriesRefused,
    RunsHook,
    StoredHook,
    on_runs_stored,
    on_stored,
    on_stored_entries,
)
from external_interface.storage.outbox.status import backlog
from external_interface.storage.routing import SinkRouter, build_sinks
from external_interface.storage.sinks.base import Origin, PermanentSinkError, Sink, entry_version
from settings.storage import get_storage_settings
from utils import process
from utils.lua import load_lua
from utils.outage import OUTAGE
from utils.redis import as_str, get_redis

log = logging.getLogger("external_interface.storage.outbox")

AUTOCLAIM = load_lua(__file__, "autoclaim.lua")
MAX_BLOCK = 0.5  # seconds one XREADGROUP may block while entries come
# while the stream stays empty the blocks double up to this (a new entry still returns the
# blocked read at once); a stop ends the block in flight (reader.py), or blocks stay under
# SHORT_IDLE_BLOCK and 2/3 of the client's socket timeout
MAX_IDLE_BLOCK = 20.0
SHORT_IDLE_BLOCK = 2.0
HORIZON_EVERY = 5.0  # seconds between two horizon updates while entries come
HORIZON_IDLE = 60.0  # ... and while none came since the last one (an older horizon is safe)
SETTLE_EVERY = 0.5  # seconds between two `settle` calls while the drainer holds nothing


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
        runs_hooks: Iterable[RunsHook] | None = None,
        max_idle_block: float = MAX_IDLE_BLOCK,
    ) -> None:
        self.r = redis_client
        self.reader = BlockingReader(redis_client)
        self.max_idle_block = max_idle_block
        self.prefix = prefix
        self.router = sinks if isinstance(sinks, SinkRouter) else SinkRouter(list(sinks))
        self.batch = max(1, batch)
        self.interval = max(0.001, interval)
        self.idle_flush = max(0.0, idle_flush)
        self.group = group
        self.consumer = consumer or ""
        self.claim_idle = claim_idle
        self.claim_every = claim_every if claim_every is not None else max(0.2, claim_idle / 4)
        # claims of a dead drainer's entries: every `claim_every` while entries come or a task
        # ran here since the last claim; else the wait doubles up to this (2x `claim_idle` max)
        self.claim_idle_max = max(self.claim_every, claim_idle)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.shutdown_timeout = shutdown_timeout
        self.hooks = list(hooks) if hooks is not None else on_stored  # module list by default
        self.own_sinks = own_sinks
        self.runs_hooks = list(runs_hooks) if runs_hooks is not None else on_runs_stored
        self.stream = stream_key(prefix)
        self._ack = self.r.register_script(ACK)
        self._autoclaim = self.r.register_script(AUTOCLAIM)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = {"stored": 0, "dead": 0, "failures": 0, "claimed": 0}

    @classmethod
    def from_settings(
        cls, settings: Settings | None = None, sinks: SinkRouter | None = None, **kw: Any
    ) -> Drainer:
        settings = settings or get_settings()
        storage = get_storage_settings()
        kw.setdefault("claim_idle", storage.outbox_claim_idle)
        kw.setdefault("max_backoff", storage.outbox_max_backoff)
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

    def request_stop(self) -> None:
        """Ask `run()` (on its own event) to flush and return, ending its blocked read now."""
        self._stop.set()
        self.reader.unblock()
        process.note_tasks_done()  # a gathering window ends too

    def stop(self, timeout: float | None = None) -> None:
        self.request_stop()
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
        started, left = False, cast("int | None", None)  # left: most tasks a run read has left
        next_claim = next_horizon = next_settle = 0.0
        claim_wait = self.claim_every  # doubled while idle, up to `claim_idle_max`
        worked = False  # entries read, stored or claimed, or a task run, since the last claim
        watch = process.Watch()
        idle_block = MAX_BLOCK  # the next block while nothing comes (see MAX_IDLE_BLOCK)
        moved = True  # entries read, claimed or held since the last horizon update
        self.reader.stopping = False
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
                    if watch.worked() or buffer:
                        worked = True
                        next_claim = min(next_claim, now + self.claim_every)
                    if now >= next_horizon:
                        moved = moved or bool(buffer)
                        if moved:  # unchanged while idle: the sink has it already
                            self.update_horizon(buffer)
                        next_horizon = now + (HORIZON_EVERY if moved else HORIZON_IDLE)
                        moved = False
                    if not retrying and now >= next_claim and len(buffer) < self.batch:
                        claimed = self.claim(self.batch - len(buffer))
                        worked = worked or bool(claimed)
                        claim_wait = (
                            self.claim_every if worked else min(self.claim_idle_max, 2 * claim_wait)
                        )
                        next_claim = now + claim_wait
                        worked = False
                        if claimed and not buffer:
                            first_at = now
                        # XAUTOCLAIM also returns our own idle entries: after a Redis error
                        # the ones we already hold come back; keep each id once
                        # (test_entries_claimed_back_after_a_redis_error_are_held_once)
                        merge_new(buffer, claimed)
                        moved = moved or bool(claimed)
                    quiet = False
                    if not retrying and len(buffer) < self.batch:
                        # short blocks: stop() is noticed quickly, socket timeouts never hit;
                        # an empty buffer has no flush to wait for: the idle block
                        wait = (
                            min(self.interval - (now - first_at), MAX_BLOCK)
                            if buffer
                            else idle_block
                        )
                        if buffer and self.idle_flush:  # shorter in a run's last wave
                            wait = min(wait, gather_window(left, self.idle_flush))
                        if buffer:
                            # entries are coming: they gather for `wait`, then one read takes
                            # them all (a blocking read returns with the first)
                            process.gather(max(0.0, wait), stop)  # a run's end: at once
                            new = self.read(self.batch - len(buffer), None)
                        else:
                            new = self.read(self.batch - len(buffer), max(1, int(wait * 1000)))
                        # nothing more came for `idle_flush` (the writers paused), or the
                        # runs read have no task left (below): store now, not after `interval`
                        quiet = bool(buffer) and not new and self.idle_flush > 0
                        if new and not buffer:
                            first_at = time.monotonic()
                        longest = self.reader.longest(self.max_idle_block, SHORT_IDLE_BLOCK)
                        idle_block = MAX_BLOCK if new or buffer else min(longest, 2 * idle_block)
                        if new and next_horizon - now > HORIZON_EVERY:
                            next_horizon = now + HORIZON_EVERY  # entries again: soon
                        moved = moved or bool(new)
                        if new:
                            worked = True
                            next_claim = min(next_claim, time.monotonic() + self.claim_every)
                        merge_new(buffer, new)
                        left = tasks_left(self.r, self.prefix, buffer) if new else left
                        quiet = quiet or (bool(new) and left is not None and left <= 0)
                    due = quiet or time.monotonic() - first_at >= self.interval
                    if buffer and (len(buffer) >= self.batch or due or retrying):
                        buffer = self.flush(buffer)
                        if buffer:
                            retrying += 1
                            self.heartbeat(buffer)
                            stop.wait(self._delay(retrying))
                        else:
                            retrying = 0
                    if not buffer and not retrying and time.monotonic() >= next_settle:
                        self.settle()
                        next_settle = time.monotonic() + SETTLE_EVERY
                    errors = 0
                    OUTAGE.answered(getattr(self.reader, "read_at", None))  # every stream read
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
            self.reader.close()
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
        # tidy XINFO CONSUMERS: a consumer without pending entries is not needed any more
        with contextlib.suppress(redis.RedisError):
            if not self.r.xpending_range(
                self.stream, self.group, "-", "+", 1, consumername=self.consumer
            ):
                self.r.xgroup_delconsumer(self.stream, self.group, self.consumer)

    def drain_once(self, claim: bool = False) -> int:
        """Store everything readable now (scripts, tests). -> entries acknowledged."""
        self.consumer = self.consumer or default_consumer()
        self.ensure_group()
        self.update_horizon()
        before = self.stats["stored"] + self.stats["dead"]
        buffer = self.own_pending()
        if claim:
            merge_new(buffer, self.claim(self.batch))
        while True:
            if len(buffer) < self.batch:
                merge_new(buffer, self.read(self.batch - len(buffer), None))
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
        """New entries; a blocking read goes through the reader a stop can unblock."""
        client: Any = self.reader if block_ms else self.r
        try:
            resp = client.xreadgroup(
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
                    gone.append(as_str(entry_id))
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
            cursor = as_str(resp[0])
            ids += [as_str(i) for i in resp[1]]
            if cursor == "0-0" or len(ids) >= count:
                break
        return self._claimed(self._claimed_entries(self.stream, ids, OutboxEntry.parse))

    def _claimed_entries(
        self, stream: str, ids: Sequence[str], make: Callable[[str, Any], OutboxEntry]
    ) -> list[OutboxEntry]:
        """The entries of claimed `ids` (`make(id, fields)`); an id whose entry is gone (stored
        and deleted meanwhile) is acknowledged."""
        if not ids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for i in ids:
            pipe.xrange(stream, i, i)
        out, gone = [], []
        for i, rows in zip(ids, pipe.execute(), strict=True):
            if rows:
                out.append(make(i, rows[0][1]))
            else:
                gone.append(i)
        if gone:
            self.r.xack(stream, self.group, *gone)
        return out

    def _claimed(self, out: list[OutboxEntry]) -> list[OutboxEntry]:
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
        ack script was lost). A sink that forgot them would write them a second time
        (tests/torture/test_crash_paths.py::test_the_drainer_writes_an_entry_once_across_a_redis_error)."""
        targets = [s for s in self.router.all() if hasattr(s, "horizon")]
        if not targets:
            return
        first = self.r.xrange(self.stream, "-", "+", count=1)
        if first:
            horizon = as_str(first[0][0])
        else:
            try:
                horizon = as_str(self.r.xinfo_stream(self.stream)["last-generated-id"])
            except redis.ResponseError:  # no stream yet
                return
        if held:
            oldest = min((e.id for e in held), key=entry_version)
            if entry_version(oldest) < entry_version(horizon):
                horizon = oldest
        for sink in targets:
            try:
                sink.horizon(horizon)
            except Exception:
                log.exception("sink %s: horizon update failed", sink.name)

    def settle(self) -> None:
        """This drainer holds nothing: sinks that tidy up between writes do it now (the JSONL
        sink compacts the types written since they were last compacted)."""
        for sink in self.router.all():
            settle = getattr(sink, "settle", None)
            if settle is None:
                continue
            try:
                settle()
            except Exception:
                log.exception("sink %s: settling failed", sink.name)

    # --- writing -----------------------------------------------------------------------------

    def flush(self, entries: Sequence[OutboxEntry]) -> list[OutboxEntry]:
        """Write, hook, acknowledge and count. -> the entries to retry later (sink down).

        Each entry id is written once per batch even if a caller passed it twice: the JSONL
        sink only skips entries committed by *earlier* writes (test_an_entry_passed_twice_is_written_once)."""
        groups: dict[tuple[str, tuple[str, ...]], list[OutboxEntry]] = {}
        dead: list[Dead] = []
        for e in merge_new([], entries):
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
                refused, again = self._run_entry_hooks(item_type, group)
                dead += [(e, refused[e.id], "after_store") for e in group if e.id in refused]
                retry += [e for e in group if e.id in again and e.id not in refused]
                acked += [e for e in group if e.id not in refused and e.id not in again]
                if self.hooks or on_stored_entries:
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

    def _run_entry_hooks(
        self, item_type: str, entries: Sequence[OutboxEntry]
    ) -> tuple[dict[str, str], set[str]]:
        """The entries hooks; -> (entries refused for good, with the reason; entries to
        write and hook again later)."""
        refused: dict[str, str] = {}
        again: set[str] = set()
        for hook in on_stored_entries:
            try:
                hook(item_type, [e for e in entries if e.id not in refused and e.id not in again])
            except EntriesRefused as exc:
                refused.update(exc.dead)
                again |= exc.again
        return refused, again

    def _run_hooks(self, item_type: str, entries: Sequence[OutboxEntry]) -> None:
        if not self.hooks:
            return
        items = [i for e in entries for i in e.items]
        for hook in self.hooks:
            hook(item_type, items)

    def _acknowledge(
        self,
        stored: Sequence[OutboxEntry],
        dead: Sequence[Dead],
        failed: Mapping[str, str],
        healthy: Iterable[str],
    ) -> None:
        pipe = self.r.pipeline(transaction=False)
        if stored or dead:
            keys, args = ack_call(self.prefix, self.group, stored, dead)
            self._ack(keys=keys, args=args, client=pipe)
        note_errors(pipe, self.prefix, self.consumer, failed, healthy)
        if len(pipe):
            pipe.execute()
        self._acknowledged(stored, dead)

    def _acknowledged(self, stored: Sequence[OutboxEntry], dead: Sequence[Dead]) -> None:
        """After a batch's acknowledgement: count it and tell the runs hooks whose runs moved."""
        self.stats["stored"] += len(stored)
        self.stats["dead"] += len(dead)
        if stored or dead:  # the runs' counters moved: work for the idle back-offs
            process.note_work()
        rids = list(
            dict.fromkeys([e.run for e in stored if e.run] + [e.run for e, _, _ in dead if e.run])
        )
        for hook in self.runs_hooks if rids else ():
            try:
                hook(rids)
            except Exception:  # the items are stored and counted; a hook is best effort
                log.exception("outbox: runs hook failed for %s", rids)

    def backlog(self) -> dict[str, Any]:
        return backlog(self.r, self.prefix, self.group)
