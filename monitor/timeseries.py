"""Numbers over time, for the report: a compact, bounded time series in Redis.

Every counter the system keeps (run counters, task and site metrics, pool health, dedup
marks) is a running total or a gauge: it says how much, not when. Once a minute
(`CHAINCRAWL_MONITOR_SERIES_INTERVAL`) one process of the fleet (a lock decides which: every
worker runs the sampler thread; one that runs no task tries less often, `Sampler`) appends a
point to `run:{rid}:series` (each active or storing run's counters) and `series:fleet` (task,
site, pool and dedup metrics): their fields are in docs/monitoring.md, "Stable Redis keys".

Both keep the newest `CHAINCRAWL_MONITOR_SERIES_POINTS` (1440: a day of minutes); a run's
expires with the run (`CHAINCRAWL_RUN_RETENTION`). What happened between two points is their
difference, so a reader needs no point at the exact start of its window. Cost: per interval,
one read of each active run's counters and one of the metrics hashes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import orjson

from config import Settings, get_settings
from ledger.state import RunState
from monitor import health
from monitor.metrics import read_hashes
from settings.monitor import get_monitor_settings
from utils import process
from utils.keyspace import Keyspace

log = logging.getLogger("chaincrawl.series")

TASK_FIELDS = ("started", "succeeded", "failed", "retried", "waited", "items", "requests")
ERROR_PREFIXES = ("failed:", "retried:", "waited:")
SITE_FIELDS = ("requests", "succeeded", "failed", "items", "latency_count", "latency_ms_sum")


def run_series_key(s: Settings, rid: str) -> str:
    return Keyspace(s.key_prefix).run(rid, "series")


def fleet_key(s: Settings) -> str:
    return s.key("series", "fleet")


def dedup_stats_key(prefix: str, namespace: str) -> str:
    """Counts of what dedup marks found (new, unchanged, changed) for one namespace; beside,
    not under, the namespace's bucket keys (`dedup:{ns}:*`)."""
    return f"{prefix}:dedupstats:{namespace}"


def _pick(
    m: Mapping[str, int], fields: tuple[str, ...], prefixes: tuple[str, ...]
) -> dict[str, int]:
    return {k: v for k, v in m.items() if v and (k in fields or k.startswith(prefixes))}


def fleet_point(client: Any, s: Settings, now: float) -> dict[str, Any]:
    """The fleet-wide totals now (the task and site metrics, pools, dedup marks)."""
    tasks = read_hashes(client, s.key("metrics", "task", ""))
    sites = read_hashes(client, s.key("metrics", "site", ""))
    dedup = read_hashes(client, dedup_stats_key(s.key_prefix, ""))
    pools = {h.name: [h.size, h.bans, h.produced] for h in health.collect(client, s)}
    return {
        "t": round(now, 3),
        "tasks": {t: _pick(m, TASK_FIELDS, ERROR_PREFIXES) for t, m in tasks.items()},
        "sites": {
            site: _pick(m, SITE_FIELDS, ("latency_le:", "waited:")) for site, m in sites.items()
        },
        "pools": pools,
        "dedup": dedup,
    }


def sample(client: Any, s: Settings | None = None, now: float | None = None) -> int:
    """Append one point to every active or storing run's series and to the fleet's; -> runs."""
    s = s or get_settings()
    ms = get_monitor_settings()
    now = time.time() if now is None else now
    ks = Keyspace(s.key_prefix)
    rids = sorted(m.decode() for m in client.smembers(ks.active_runs))
    rids = list(dict.fromkeys(rids + RunState(client, s).storing_runs()))
    counters = []
    if rids:
        pipe = client.pipeline(transaction=False)
        for rid in rids:
            pipe.hgetall(ks.counters(rid))
        counters = pipe.execute()
    pipe = client.pipeline(transaction=False)
    for rid, raw in zip(rids, counters, strict=True):
        totals = {k.decode(): int(v) for k, v in raw.items() if b":" not in k}
        if not totals:
            continue
        key = run_series_key(s, rid)
        pipe.rpush(key, orjson.dumps({"t": round(now, 3), "c": totals}))
        pipe.ltrim(key, -ms.series_points, -1)
        pipe.expire(key, s.run_retention)
    pipe.rpush(fleet_key(s), orjson.dumps(fleet_point(client, s, now)))
    pipe.ltrim(fleet_key(s), -ms.series_points, -1)
    pipe.execute()
    return len(rids)


def read(client: Any, key: str, since: float | None = None) -> list[dict[str, Any]]:
    """A series' points (oldest first), from `since` on when given."""
    points = [orjson.loads(raw) for raw in client.lrange(key, 0, -1)]
    return [p for p in points if since is None or p["t"] >= since]


SERIES_IDLE_MAX = 600.0  # seconds between two samples of a process that runs no task


class Sampler:
    """A daemon thread in every worker; a Redis lock lets one process sample per interval.

    While its process runs no task the tries back off: each interval without a task started
    doubles the wait, up to `SERIES_IDLE_MAX`; the first task to start ends a longer wait at
    once (a point right at the start of the work, from the counters the idle spell left),
    and the tries are back to every interval. A fleet with one busy process keeps a point
    every interval; an idle fleet, whose totals do not move, one every `SERIES_IDLE_MAX`."""

    def __init__(
        self,
        client: Any,
        s: Settings | None = None,
        interval: float | None = None,
        idle_max: float = SERIES_IDLE_MAX,
    ):
        self.r = client
        self.s = s or get_settings()
        self.interval = interval or get_monitor_settings().series_interval
        self.idle_max = max(self.interval, idle_max)
        self.wait = self.interval  # before the next try
        self._stop = threading.Event()
        self._watch = process.Watch()
        self._thread: threading.Thread | None = None

    def tick(self, now: float | None = None) -> bool:
        """Sample if no other process did within this interval; -> whether this one did."""
        won = self.r.set(
            self.s.key("series", "lock"), b"1", nx=True, px=max(1, int(self.interval * 900))
        )
        if won:
            sample(self.r, self.s, now)
        return bool(won)

    def next_wait(self) -> float:
        """The wait after a try: the interval once a task started since the last one, else
        doubled (up to `idle_max`)."""
        worked = self._watch.worked()
        self.wait = self.interval if worked else min(self.idle_max, 2 * self.wait)
        return self.wait

    def start_thread(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._loop, name="series-sampler", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        self._stop.set()
        self._watch.wake.set()

    def _loop(self) -> None:
        self.wait = self.interval
        while not self._stop.is_set():
            if self.wait > self.interval:  # backed off: the first task ends the wait
                self._watch.wait(self.wait, self._stop)
            else:
                self._stop.wait(self.wait)
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception as exc:  # Redis away: the next interval tries again
                log.warning("series sample failed: %s", exc)
            self.next_wait()
