"""Task metrics in Redis under stable names, aggregated across every worker.

Keys (prefix `cc`):
    metrics:task:{task}   hash  per endpoint task
    metrics:site:{site}   hash  per site (sum over its endpoints)
Fields (stable; dashboards and the exporter rely on them):
    started, succeeded, failed, failed:{ErrorType}, retried, retried:{ErrorType},
    waited, items, requests, http:{status}, bytes, latency_ms_sum, latency_count,
    latency_le:{bound_ms} (cumulative histogram buckets, Prometheus style, incl. +Inf)

Writes ride on the pipelines the task already sends (begin/commit), so metrics cost no extra
round trip.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from config import Settings, get_settings

LATENCY_BUCKETS_MS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)


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
        for b in LATENCY_BUCKETS_MS:
            if ms <= b:
                self.counts[f"latency_le:{b}"] += 1
        self.counts["latency_le:+Inf"] += 1

    def flush(self, pipe: Any, task: str, site: str, s: Settings | None = None) -> None:
        if not self.counts:
            return
        for key in (task_key(task, s), site_key(site, s)):
            for field, n in self.counts.items():
                if n:
                    pipe.hincrby(key, field, n)
        self.counts.clear()


def read(client: Any, key: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(key).items()}


def all_task_metrics(client: Any, s: Settings | None = None) -> dict[str, dict[str, int]]:
    s = s or get_settings()
    prefix = s.key("metrics", "task", "")
    out: dict[str, dict[str, int]] = {}
    for key in client.scan_iter(match=prefix + "*", count=500):
        out[key.decode()[len(prefix) :]] = read(client, key)
    return out


def error_breakdown(m: Mapping[str, int], outcome: str = "failed") -> dict[str, int]:
    p = outcome + ":"
    return {k[len(p) :]: v for k, v in m.items() if k.startswith(p)}
