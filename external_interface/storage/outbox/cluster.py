"""The drainer on a Redis Cluster: reads each run's own outbox stream.

On a cluster a run's commit script cannot reach the global outbox (another slot), so it XADDs
the run's items to `run:{rid}:outbox` (tasks without a run: `outbox:{norun}`), in the run's
slot (utils/keyspace.py). `ClusterDrainer` is the `Drainer` (same loop, batching, sinks,
hooks, backoff) with the stream side replaced:

- the streams read are those of the runs in `runs:active` and `runs:storing` (a run is in
  one of them from its first dispatch until its items are stored; a cancelled run too),
  plus the one of tasks without a run; a stream that leaves both sets with entries left is
  read until it is empty; each has its own consumer group "sinks", created once the stream
  exists;
- a cross-slot XREADGROUP is refused, so each stream is read on its own (one pipeline) and
  nothing can block: the drainer polls, every 0.2 s after an empty read, doubling while the
  reads stay empty up to 1 s, and at once again after a read that returned entries (a
  steady load is read without a wait, an idle drainer costs one read a second a stream);
  while the drainer holds entries it reads once a window of `idle_flush`, as on one Redis;
- an entry's id is `<rid>/<stream entry id>` (`/<id>` without a run): ids of two streams
  can be equal, and a sink that remembers written entries by id (the JSONL sink) must tell
  them apart; `entry_version` reads the part after the slash;
- a batch is acknowledged with one `ack.lua` call per stream, whose keys are all in the
  run's slot: the stream, its dead letters (`run:{rid}:outbox:dead`) and the run's counters.
  XACK, XDEL and HINCRBY `stored` happen together, so a crash between them cannot lose or
  double-count an entry. The task and site metrics (global keys) are added beside the
  script, for the streams whose entries this drainer all won;
- idle entries of dead consumers are claimed per stream (XAUTOCLAIM), as on one Redis;
- the JSONL sink's horizon is the oldest entry of all the streams read, less a margin for
  the clocks of the nodes (each stamps its own stream's ids).

A compacted run's stream is deleted with its bookkeeping (ledger/state.py `compact`); a
stream or group found missing is skipped, never created again.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from external_interface.storage.outbox.drainer import Drainer
from external_interface.storage.outbox.entries import (
    Dead,
    OutboxEntry,
    ack_call,
    note_errors,
)
from external_interface.storage.sinks.base import entry_version
from utils.keyspace import Keyspace
from utils.redis import as_str, is_cluster
from utils.slots import LostRange, known_lost, lost_for, lost_now, reason

log = logging.getLogger("external_interface.storage.outbox")

CLOCK_MARGIN_MS = 60_000  # the horizon is this much older than the oldest entry seen
REFRESH_EVERY = 0.2  # seconds between two reads of the active and storing run sets
POLL_MIN = 0.2  # seconds from an empty read of the streams to the next read
POLL_MAX = 1.0  # ... doubling while the reads stay empty


@dataclass
class ClusterEntry(OutboxEntry):
    """An entry of one run's stream: `id` is `<rid>/<entry id>`, unique across streams."""

    stream: str = ""
    sid: str = ""  # the entry id in its stream


def origin_id(rid: str, entry_id: str) -> str:
    """The id of an entry of run `rid`'s stream as the sinks see it."""
    return f"{rid}/{entry_id}"


class ClusterDrainer(Drainer):
    """The `Drainer` reading every run's own stream on a Redis Cluster (module docstring)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.ks = Keyspace(self.prefix)
        self.stream = self.ks.run_outbox("")  # what the log lines name; one stream of many
        self._streams: dict[str, str] = {}  # stream key -> run id ("" without a run)
        self._rid_of: dict[str, str] = {}  # the same, with the streams on a lost slot range
        self._grouped: set[str] = set()  # streams whose group exists
        self._next_refresh = 0.0
        self._storing_only: set[str] = set()  # runs of the storing set, not of the active one
        self._unnoted: set[str] = set()  # runs with dead letters, `outbox_dead_runs` lost
        self._poll = 0.0  # seconds from the last empty read to the next read (`read`)
        self._next_poll = 0.0  # when the next read is due (monotonic)
        self.read_at = 0.0  # when every stream was last read (monotonic)
        self.held = HeldBack()  # entries read before their stream's slots were lost

    # --- the streams -------------------------------------------------------------------------

    def dead_stream(self, rid: str) -> str:
        """Dead letters of a run's stream, in its slot (the global one is on another)."""
        return self.ks.run_outbox_dead(rid)

    def counters(self, rid: str) -> str:
        return self.ks.counters(rid)

    def streams(self) -> dict[str, str]:
        """Stream key -> run id of the streams to read: active and storing runs, runless."""
        now = time.monotonic()
        if now >= self._next_refresh:
            pipe = self.r.pipeline(transaction=False)
            pipe.smembers(self.ks.active_runs)
            pipe.smembers(self.ks.storing_runs)
            active, storing = pipe.execute()
            rids = sorted({as_str(m) for m in (*active, *storing)})
            self._storing_only = {as_str(m) for m in storing} - {as_str(m) for m in active}
            streams = {self.ks.run_outbox(""): ""}
            streams.update({self.ks.run_outbox(rid): rid for rid in rids})
            lost = known_lost(self.r)  # a stream on a lost slot range: read once it returns
            held = {s: r for s, r in self._rid_of.items() if lost_for(lost, s)}
            full = {**held, **streams}  # its run still known: for the entries read before
            streams = {s: rid for s, rid in streams.items() if not lost_for(lost, s)}
            left = [s for s in self._streams if s not in streams and not lost_for(lost, s)]
            if left:  # out of both sets (a cancelled run) with entries still to store: kept
                pipe = self.r.pipeline(transaction=False)
                for s in left:
                    pipe.xlen(s)
                for s, n in zip(left, pipe.execute(), strict=True):
                    if n:
                        streams[s] = self._streams[s]
            self._streams = streams
            self._rid_of = {**full, **streams}
            self._grouped &= set(streams)
            self._next_refresh = now + REFRESH_EVERY
        return self._streams

    def ensure_group(self) -> None:
        """Create the group of each stream that exists and has none (never the stream: a
        compacted run's stream stays gone)."""
        todo = [s for s in self.streams() if s not in self._grouped]
        if not todo:
            return
        pipe = self.r.pipeline(transaction=False)
        for s in todo:
            pipe.xgroup_create(s, self.group, id="0")
        settled = []
        for s, res in zip(todo, pipe.execute(raise_on_error=False), strict=True):
            if res is True or (isinstance(res, redis.ResponseError) and "BUSYGROUP" in str(res)):
                self._grouped.add(s)
            elif isinstance(res, Exception) and not isinstance(res, redis.ResponseError):
                raise res  # a connection error; "no such key": the stream has no entry yet
            elif self._streams.get(s) in self._storing_only:
                # an ended run without a stream: compacted, or it never had an item (a
                # stream emptied by acknowledgements stays): nothing left to store
                settled.append(self._streams[s])
        if settled:
            self.r.srem(self.ks.storing_runs, *settled)

    def _read_all(self, start: str, count: int) -> list[OutboxEntry]:
        """XREADGROUP of every grouped stream from `start` (">" new, "0" our pending)."""
        self.ensure_group()
        streams = [s for s in self.streams() if s in self._grouped]
        if not streams:
            self.read_at = time.monotonic()
            return []
        pipe = self.r.pipeline(transaction=False)
        for s in streams:
            pipe.xreadgroup(self.group, self.consumer, {s: start}, count=count)
        out: list[OutboxEntry] = []
        for s, res in zip(streams, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(res, redis.ResponseError) and "NOGROUP" in str(res):
                self._grouped.discard(s)  # deleted (compacted) under us
                continue
            if isinstance(res, Exception):
                raise res
            out += self._cluster_entries(s, res)
        self.read_at = time.monotonic()  # every stream answered (utils.outage: Redis is back)
        return out

    def _cluster_entries(self, stream: str, resp: Any) -> list[OutboxEntry]:
        if isinstance(resp, dict):  # RESP3
            resp = list(resp.items())
        rid = self._rid_of.get(stream, "")
        out: list[OutboxEntry] = []
        gone: list[str] = []
        for _stream, messages in resp or []:
            for entry_id, fields in messages:
                if fields:
                    out.append(self._entry(stream, rid, as_str(entry_id), fields))
                elif entry_id is not None:
                    gone.append(as_str(entry_id))
        if gone:  # deleted while pending: nothing to store
            self.r.xack(stream, self.group, *gone)
        return out

    @staticmethod
    def _entry(stream: str, rid: str, sid: str, fields: Mapping[bytes, bytes]) -> ClusterEntry:
        e = OutboxEntry.parse(origin_id(rid, sid), fields)
        return ClusterEntry(**{**e.__dict__, "stream": stream, "sid": sid})

    # --- the Drainer's stream side -----------------------------------------------------------

    def read(self, count: int, block_ms: int | None) -> list[OutboxEntry]:
        """New entries of every stream; none: wait `block_ms` (a cluster cannot block on
        streams of several slots in one call, so it polls). Each empty read doubles the
        time to the next one, from `POLL_MIN` up to `POLL_MAX`; a read that returns entries
        makes the next one immediate. A call before the next read is due waits (at most
        `block_ms`) and returns nothing. `block_ms=None` (drain_once) always reads."""
        back = self.held.served(known_lost(self.r) if self.held else [])
        if back:  # their slots are served again: stored with the next batch
            return back
        now = time.monotonic()
        if block_ms is not None and now < self._next_poll:
            time.sleep(min(block_ms / 1000, self._next_poll - now))
            return []
        out = self._read_all(">", count)
        if out:
            self._poll = 0.0
            self._next_poll = 0.0
            return out
        self._poll = min(POLL_MAX, max(POLL_MIN, self._poll * 2))
        self._next_poll = time.monotonic() + self._poll
        if block_ms:
            time.sleep(min(block_ms / 1000, self._poll))
        return out

    def own_pending(self) -> list[OutboxEntry]:
        return self._read_all("0", self.batch)

    def claim(self, count: int) -> list[OutboxEntry]:
        """XAUTOCLAIM each stream's entries idle for `claim_idle` seconds."""
        self.ensure_group()
        out: list[OutboxEntry] = []
        for stream, rid in list(self.streams().items()):
            if stream not in self._grouped or len(out) >= count:
                continue
            try:
                resp = self._autoclaim(
                    keys=[stream],
                    args=[
                        self.group,
                        self.consumer,
                        int(self.claim_idle * 1000),
                        "0-0",
                        count - len(out),
                    ],
                )
            except redis.ResponseError as e:
                if "NOGROUP" not in str(e):
                    raise
                self._grouped.discard(stream)
                continue
            ids = [as_str(i) for i in resp[1]]
            out += self._claimed_entries(stream, ids, functools.partial(self._entry, stream, rid))
        return self._claimed(out)

    def heartbeat(self, entries: Sequence[OutboxEntry]) -> None:
        with contextlib.suppress(redis.RedisError):
            for stream, group in _by_stream(entries).items():
                self.r.xclaim(
                    stream, self.group, self.consumer, 0, [e.sid for e in group], justid=True
                )

    def update_horizon(self, held: Sequence[OutboxEntry] = ()) -> None:
        """The oldest entry of every stream read (or held), less `CLOCK_MARGIN_MS`."""
        targets = [s for s in self.router.all() if hasattr(s, "horizon")]
        if not targets:
            return
        streams = list(self.streams())
        pipe = self.r.pipeline(transaction=False)
        for s in streams:
            pipe.xrange(s, "-", "+", count=1)
            pipe.xinfo_stream(s)
        res = pipe.execute(raise_on_error=False)
        versions = [entry_version(e.sid) for e in held if isinstance(e, ClusterEntry)]
        for n in range(len(streams)):
            first, info = res[2 * n], res[2 * n + 1]
            if isinstance(first, Exception) or isinstance(info, redis.ResponseError):
                continue  # no such stream (yet, or any more)
            if isinstance(info, Exception):
                return  # a connection error: no horizon this time
            if first:
                versions.append(entry_version(as_str(first[0][0])))
            else:
                versions.append(entry_version(as_str(info["last-generated-id"])))
        if not versions:
            return
        horizon = max(0, min(versions) - CLOCK_MARGIN_MS * 1_000_000)
        for sink in targets:
            try:
                sink.horizon(f"{horizon // 1_000_000}-{horizon % 1_000_000}")
            except Exception:
                log.exception("sink %s: horizon update failed", sink.name)

    def _shutdown_flush(self, buffer: list[OutboxEntry]) -> None:
        """As on one Redis, then leave the groups of streams where this consumer holds nothing."""
        super()._shutdown_flush(buffer)
        with contextlib.suppress(redis.RedisError):
            for s in self._grouped:
                if not self.r.xpending_range(
                    s, self.group, "-", "+", 1, consumername=self.consumer
                ):
                    self.r.xgroup_delconsumer(s, self.group, self.consumer)

    def flush(self, entries: Sequence[OutboxEntry]) -> list[OutboxEntry]:
        """As on one Redis, without the entries of streams on a lost slot range: a cluster
        pipeline with one command for a lost range fails whole, so their acknowledgement
        would fail every run's. They are held back (`HeldBack`: pending in their stream,
        given back by `read` once their slots are served) and the other runs' entries are
        stored and acknowledged. A range found lost by this flush (its acknowledgement
        failed) is left out the same way, and the rest flushed again (written twice to the
        sinks: an entry is written at least once)."""
        rest = self.held.hold(entries, known_lost(self.r))
        try:
            return super().flush(rest)
        except redis.RedisError as e:
            again = self.held.hold(rest, lost_now(self.r, e))
            if len(again) == len(rest):
                raise  # not a lost range's (or none of these entries is on it)
            return super().flush(again)

    def _acknowledge(
        self,
        stored: Sequence[OutboxEntry],
        dead: Sequence[Dead],
        failed: Mapping[str, str],
        healthy: Iterable[str],
    ) -> None:
        """One `ack.lua` call per stream, on its slot; metrics beside it (module docstring).
        The global keys written beside (the runs with dead letters, the sinks' errors) may be
        on a lost slot range: a pipeline with a command for it fails whole, so once this
        process knows the range lost they are left out (the runs noted once it returns) and
        the acknowledgements of the runs on the other masters go on."""
        calls: dict[str, tuple[list[OutboxEntry], list[Dead]]] = {}
        for e in stored:
            calls.setdefault(_stream(e), ([], []))[0].append(e)
        for d in dead:
            calls.setdefault(_stream(d[0]), ([], []))[1].append(d)
        pipe = self.r.pipeline(transaction=False)
        order = list(calls)
        for stream in order:
            keys, args = self._ack_call(stream, *calls[stream])
            pipe.execute_command("EVALSHA", self._ack.sha, len(keys), *keys, *args)
        lost = known_lost(self.r)  # no command while this process has seen no range lost
        noted = {self._rid_of.get(_stream(d[0]), "") for d in dead} - {""} | self._unnoted
        held = noted if lost_for(lost, self.ks.outbox_dead_runs) else set()
        if noted and not held:  # the status readers find these runs' dead letters unscanned
            pipe.sadd(self.ks.outbox_dead_runs, *noted)
        if not lost_for(lost, self.ks.outbox_errors):
            note_errors(pipe, self.prefix, self.consumer, failed, healthy)
        try:
            res = self._sent(pipe, order, calls)
        except redis.RedisError as e:
            self._unnoted = noted
            lost_now(self.r, e)  # a range just lost: the retry leaves its keys out
            raise
        self._unnoted = held
        won = {stream: int(r) for stream, r in zip(order, res, strict=False)}
        self._count_metrics(calls, won)
        self._acknowledged(stored, dead)

    def _sent(
        self,
        pipe: Any,
        order: Sequence[str],
        calls: Mapping[str, tuple[list[OutboxEntry], list[Dead]]],
    ) -> list[Any]:
        """The pipeline's replies, the `ack.lua` ones first (one stream each, in `order`,
        sent again with its script to a node that lost it); any error raised."""
        res = pipe.execute(raise_on_error=False) if len(pipe) else []
        for n, (stream, r) in enumerate(zip(order, res, strict=False)):
            if isinstance(r, redis.exceptions.NoScriptError):  # a restarted or flushed node
                keys, args = self._ack_call(stream, *calls[stream])
                # EVAL on the stream's node caches it there (SCRIPT LOAD is sent to every
                # master, a lost one too)
                res[n] = self.r.eval(as_str(self._ack.script), len(keys), *keys, *args)
        for r in res:
            if isinstance(r, Exception):
                raise r
        return list(res)

    def _ack_call(
        self, stream: str, stored: Sequence[OutboxEntry], dead: Sequence[Dead]
    ) -> tuple[list[str], list[Any]]:
        """`ack_call` for one stream: every key in the run's slot; the counters of the
        entries' run (an entry naming another run is counted nowhere); no metrics."""
        rid = self._rid_of.get(stream, "")

        def run_keys(run: str) -> tuple[str, str] | None:
            return (self.counters(rid), self.ks.wake(rid)) if rid and run == rid else None

        keys = [stream, self.dead_stream(rid)]
        return ack_call(
            self.prefix, self.group, stored, dead, keys=keys, run_keys=run_keys, metrics=False,
            entry_id=_sid,
        )  # fmt: skip

    def _count_metrics(
        self, calls: Mapping[str, tuple[list[OutboxEntry], list[Dead]]], won: Mapping[str, int]
    ) -> None:
        """Per-task and per-site stored items (monitor/metrics.py) for the streams whose
        entries this drainer all won (a race with another drainer leaves them uncounted)."""
        sums: dict[tuple[str, str], int] = {}
        for stream, (stored, dead) in calls.items():
            if won.get(stream, 0) != len(stored) + len(dead):
                continue
            for field, entries in (("stored", stored), ("store_failed", [d[0] for d in dead])):
                for e in entries:
                    if e.task and e.items:
                        site = e.task.split(".", 1)[0]
                        for key in (
                            f"{self.prefix}:metrics:task:{e.task}",
                            f"{self.prefix}:metrics:site:{site}",
                        ):
                            sums[(key, field)] = sums.get((key, field), 0) + len(e.items)
        if not sums:
            return
        with contextlib.suppress(redis.RedisError):  # metrics: best effort
            pipe = self.r.pipeline(transaction=False)
            for (key, field), n in sums.items():
                pipe.hincrby(key, field, n)
            pipe.execute()


class HeldBack:
    """The entries a cluster drainer holds back while their stream's slots are lost, and the
    one line an outage the drainer's log says about them: when the first is held (naming the
    slots and nodes, not held back by `utils.outage.OutageFilter`: it carries no error), and
    when the last is given back."""

    def __init__(self) -> None:
        self.entries: dict[str, OutboxEntry] = {}
        self.since: float | None = None
        self.total = 0  # entries held back this outage

    def __bool__(self) -> bool:
        return bool(self.entries)

    def hold(self, entries: Sequence[OutboxEntry], lost: Sequence[LostRange]) -> list[OutboxEntry]:
        """Hold back the `entries` whose stream is on a `lost` range; -> the others."""
        if not lost:
            return list(entries)
        held = [e for e in entries if _stream(e) and lost_for(lost, _stream(e))]
        if not held:
            return list(entries)
        self.total += sum(1 for e in held if e.id not in self.entries)
        for e in held:
            self.entries[e.id] = e
        if self.since is None:
            self.since = time.monotonic()
            ranges = [r for r in lost if any(r is lost_for(lost, _stream(e)) for e in held)]
            log.warning(
                "outbox drainer: %s; %d entries of the runs on those slots held back (pending, "
                "stored once the slots are served: one line then), the other runs' stored",
                reason(ranges),
                len(held),
            )
        ids = {e.id for e in held}
        return [e for e in entries if e.id not in ids]

    def served(self, lost: Sequence[LostRange]) -> list[OutboxEntry]:
        """The entries held back whose stream is not on a `lost` range any more (taken)."""
        back = [e for e in self.entries.values() if not lost_for(lost, _stream(e))]
        for e in back:
            del self.entries[e.id]
        if back and not self.entries and self.since is not None:
            log.warning(
                "outbox drainer: lost slots served again after %.1fs; the %d entries held "
                "back are stored",
                time.monotonic() - self.since,
                self.total,
            )
            self.since, self.total = None, 0
        return back


def _stream(e: OutboxEntry) -> str:
    return e.stream if isinstance(e, ClusterEntry) else ""


def _sid(e: OutboxEntry) -> str:
    return e.sid if isinstance(e, ClusterEntry) else e.id


def _by_stream(entries: Iterable[OutboxEntry]) -> dict[str, list[ClusterEntry]]:
    out: dict[str, list[ClusterEntry]] = {}
    for e in entries:
        if isinstance(e, ClusterEntry):
            out.setdefault(e.stream, []).append(e)
    return out


def drainer_class(client: redis.Redis) -> type[Drainer]:
    """`ClusterDrainer` for a Redis Cluster client, else the single-Redis `Drainer`."""
    return ClusterDrainer if is_cluster(client) else Drainer
