"""Task metrics in Redis under stable names, aggregated across every worker: one hash per
endpoint task and one per site (their keys and fields, which dashboards and the exporter rely
on: docs/monitoring.md, "Stable Redis keys").

A worker adds each task's counts into a per-process `Aggregator` (a dict add under one lock);
a background thread writes the sums every `CHAINCRAWL_METRICS_FLUSH_INTERVAL` (1 s) in one
script call (`metrics_add.lua`: one HMGET and one HSET a hash, summed atomically, where a
HINCRBY a changed field cost ~25 commands a hash an interval; on a cluster one call a hash,
whose keys live on different slots). While a run's backlog is shallow
(its tail) tasks write the pending sums in their commit pipeline (at most one commit every
0.25 s a process until the backlog is below the process's slots, then every one; the commit
that completes the run writes its process's sums at once), so a run's metrics are complete
when the run is, or at most one interval later (another process's last commits of the run
that left them pending). A pipeline that fails part-way (a cluster's masters that answer
take their calls) keeps for the next try only the sums whose call failed (`unwritten`), so
none is added twice. A killed worker loses at most one interval of metrics; run counters
are exact either way (they live in the commit script). Stored fields are unchanged.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from redis.cluster import ClusterPipeline

from config import Settings, get_settings
from utils.lua import load_lua
from utils.process import pid as process_id
from utils.slots import lost_for, lost_ranges

LATENCY_BUCKETS_MS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
_LE_FIELDS = (*(f"latency_le:{b}" for b in LATENCY_BUCKETS_MS), "latency_le:+Inf")
# by bucket index: the cumulative fields a latency in that bucket adds one to
_LE_ONES = tuple(dict.fromkeys(_LE_FIELDS[i:], 1) for i in range(len(_LE_FIELDS)))
log = logging.getLogger("chaincrawl.metrics")
# sent whole by every call (EVAL hashes it each time): its comment lines left out
_ADD = "\n".join(
    line for line in load_lua(__file__, "metrics_add.lua").splitlines() if not line.startswith("--")
)


def add_sums(pipe: Any, sums: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """Queue `sums` (key -> field -> n, added to the hash's fields) on `pipe`: one script call
    for every key (one a key on a cluster pipeline, the keys' slots differ). EVAL, not EVALSHA:
    a flushed or restarted server has nothing to lose a flush to (NOSCRIPT in a commit's
    pipeline would be its error), and the body is sent once an interval. Returns the keys of
    each call queued, in order (`unwritten`)."""
    calls: list[tuple[list[str], list[Any]]] = []
    for key, counts in sums.items():
        fields = [(f, n) for f, n in counts.items() if n]
        if not fields:
            continue
        args: list[Any] = [len(fields)]
        for f, n in fields:
            args += (f, n)
        calls.append(([key], args))
    if not calls:
        return []
    if not isinstance(pipe, ClusterPipeline):
        calls = [([k for ks, _ in calls for k in ks], [a for _, args in calls for a in args])]
    for keys, args in calls:
        pipe.execute_command("EVAL", _ADD, len(keys), *keys, *args)
    return [keys for keys, _ in calls]


def unwritten(
    taken: Mapping[str, Mapping[str, int]], sent: list[list[str]], replies: list[Any]
) -> dict[str, Mapping[str, int]]:
    """Of the sums `taken` and queued first on a pipeline that failed (`sent`: the keys of
    each call, `add_sums`), those not written: the calls whose reply is an error. A cluster
    pipeline writes the calls of the masters that answer while the pipeline as a whole
    raises (another master's call, or any other command in it, failed): kept for the next
    try, those would be added twice. No `replies` (the pipeline raised before any): all."""
    if not replies:
        return dict(taken)
    failed = {
        k
        for n, keys in enumerate(sent)
        for k in keys
        if n >= len(replies) or isinstance(replies[n], Exception)
    }
    return {k: c for k, c in taken.items() if k in failed}


def task_key(task: str, s: Settings | None = None) -> str:
    return (s or get_settings()).key("metrics", "task", task)


def site_key(site: str, s: Settings | None = None) -> str:
    return (s or get_settings()).key("metrics", "site", site)


class TaskMetrics:
    """Counters gathered while one task runs, flushed into a pipeline at the end."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def request(self, status: int | None, nbytes: int) -> None:
        self.counts["requests"] += 1
        if status is not None:
            self.counts[f"http:{status}"] += 1
        self.counts["bytes"] += nbytes

    def outcome(self, outcome: str, error: str | None = None) -> None:
        self.counts[outcome] += 1
        if error:
            self.counts[f"{outcome}:{error}"] += 1

    def latency(self, seconds: float) -> None:
        ms = seconds * 1000.0
        self.counts["latency_ms_sum"] += round(ms)
        self.counts["latency_count"] += 1
        counts = self.counts
        ones = _LE_ONES[bisect_left(LATENCY_BUCKETS_MS, ms)]  # its cumulative buckets
        if counts.keys().isdisjoint(ones):  # the usual case: one latency per task
            dict.update(counts, ones)
        else:
            for f in ones:
                counts[f] += 1

    def flush(self, pipe: Any, task: str, site: str, s: Settings | None = None) -> None:
        if not self.counts:
            return
        add_sums(pipe, {task_key(task, s): self.counts, site_key(site, s): self.counts})
        self.counts.clear()

    def aggregate(self, task: str, site: str, s: Settings | None = None) -> None:
        """Hand the counts to this process's aggregator (written within the flush interval)."""
        if self.counts:
            s = s or get_settings()
            keys = _agg_keys.get((task, site))
            if keys is None or keys[0] is not s:  # built once per task and settings object
                keys = _agg_keys[(task, site)] = (s, (task_key(task, s), site_key(site, s)))
            aggregator().add(keys[1], self.counts)
            self.counts = Counter()


_agg_keys: dict[tuple[str, str], tuple[Settings, tuple[str, str]]] = {}


class Aggregator:
    """Per-process sums of task metrics, written to Redis in one pipeline per interval."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, Counter[str]] = {}
        # sums by the keys they go to (a task's and its site's): a task's counts are added
        # once, not once per key, and split into `_pending` when read (`_fold`)
        self._by_keys: dict[tuple[str, ...], Counter[str]] = {}
        self._thread: threading.Thread | None = None
        self._running = 0  # pid of the process whose flush thread runs (0: none)
        self._stop = threading.Event()

    def add(self, keys: tuple[str, ...], counts: Mapping[str, int]) -> None:
        with self._lock:
            c = self._by_keys.get(keys)
            if c is None:
                c = self._by_keys[keys] = Counter()
            c.update(counts)

    def _fold(self) -> None:
        """Split the sums by keys into the sums by key (the caller holds the lock)."""
        by_keys, self._by_keys = self._by_keys, {}
        for keys, counts in by_keys.items():
            for key in keys:
                c = self._pending.get(key)
                if c is None:
                    self._pending[key] = Counter(counts)
                else:
                    c.update(counts)

    def _take(self) -> dict[str, Counter[str]]:
        with self._lock:
            self._fold()
            taken, self._pending = self._pending, {}
        return taken

    def drain_into(
        self,
        pipe: Any,
        keep: Callable[[str], bool] | None = None,
        sent: list[list[str]] | None = None,
    ) -> dict[str, Counter[str]]:
        """Queue every pending sum on `pipe` (`add_sums`; but those whose key `keep` says
        to keep: left pending); returns what was taken, for `restore` if the pipeline fails
        (`sent` gets the keys of each call queued: what `unwritten` restores)."""
        taken = self._take()
        if keep is not None:
            kept = {k: c for k, c in taken.items() if keep(k)}
            taken = {k: c for k, c in taken.items() if k not in kept}
            self.restore(kept)
        calls = add_sums(pipe, taken)
        if sent is not None:
            sent += calls
        return taken

    def restore(self, taken: Mapping[str, Mapping[str, int]]) -> None:
        for key, counts in taken.items():
            self.add((key,), counts)

    def pending(self) -> bool:
        return bool(self._pending or self._by_keys)

    def flush(self, client: Any) -> None:
        """Write the pending sums now (one round trip); kept for the next try on failure."""
        if not self.pending():
            return
        pipe = client.pipeline(transaction=False)
        taken = self.drain_into(pipe)
        try:
            pipe.execute()
        except Exception:
            self.restore(taken)
            if not self._flush_served(client):
                raise

    def _flush_served(self, client: Any) -> bool:
        """With a slot range lost (`utils.slots`), write the sums whose keys the other masters
        serve and keep the rest for later; False when no range is lost (an outage)."""

        ranges = lost_ranges(client)
        if not ranges:
            return False
        taken = self._take()
        kept = {k: c for k, c in taken.items() if lost_for(ranges, k)}
        served = {k: c for k, c in taken.items() if k not in kept}
        self.restore(kept)
        pipe = client.pipeline(transaction=False)
        add_sums(pipe, served)
        try:
            pipe.execute()
        except Exception:
            self.restore(served)
            raise
        return True

    def start(self, client: Any, interval: float) -> None:
        """Flush every `interval` seconds from a daemon thread (idempotent, cheap when running).

        Called by every task: `Thread.is_alive()` would take the thread's state lock each time,
        which under gevent is a trip through the hub (two per page in a latency-bound crawl),
        so the running thread is known by a flag its loop clears on the way out."""
        if self._running == process_id():
            return
        with self._lock:
            if self._running == process_id():
                return
            self._stop.clear()
            self._running = process_id()  # a forked child's copy reads as not running
            self._thread = threading.Thread(
                target=self._loop, args=(client, interval), name="metrics-flush", daemon=True
            )
            try:
                self._thread.start()
            except BaseException:
                self._running = 0
                raise

    def stop(self, client: Any) -> None:
        """Stop the thread and write what is left (warm shutdown)."""
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(5)
        self._thread = None
        try:
            self.flush(client)
        except Exception as exc:
            log.warning("metrics not written at shutdown: %s", exc)

    def _loop(self, client: Any, interval: float) -> None:
        try:
            while not self._stop.wait(interval):
                try:
                    self.flush(client)
                except Exception as exc:  # Redis away: keep the sums, try again next interval
                    log.warning("metrics flush failed (kept for the next try): %s", exc)
        finally:
            self._running = 0


_aggregators: dict[int, Aggregator] = {}
_agg_lock = threading.Lock()


def aggregator() -> Aggregator:
    """This process's aggregator (a forked child gets its own)."""
    pid = process_id()
    a = _aggregators.get(pid)
    if a is None:
        with _agg_lock:
            a = _aggregators.get(pid)
            if a is None:
                a = _aggregators[pid] = Aggregator()
    return a


def read(client: Any, key: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(key).items()}


def read_hashes(client: Any, prefix: str) -> dict[str, dict[str, int]]:
    """Every hash whose key starts with `prefix`, by the rest of its key, its integer fields
    (one SCAN, then one pipelined round trip)."""
    keys = sorted(client.scan_iter(match=prefix + "*", count=1000))
    if not keys:
        return {}
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.hgetall(k)
    out: dict[str, dict[str, int]] = {}
    for k, raw in zip(keys, pipe.execute(), strict=True):
        vals: dict[str, int] = {}
        for f, v in raw.items():
            try:
                vals[f.decode()] = int(v)
            except ValueError:
                continue
        out[(k.decode() if isinstance(k, bytes) else k)[len(prefix) :]] = vals
    return out
