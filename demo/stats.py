"""Request counters for /admin/stats: what the server saw, so tests can check crawler behaviour."""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Any

MAX_TIMESTAMPS_PER_IP = 200_000


class Stats:
    """Counters since start or the last reset, plus recent arrival times per client IP."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self.reset()

    def reset(self) -> None:
        self.since = time.time()
        self.total = 0
        self.by_front: Counter[str] = Counter()
        self.by_endpoint: Counter[str] = Counter()
        self.by_ip: Counter[str] = Counter()
        self.by_status: Counter[str] = Counter()
        self.rejections: Counter[str] = Counter()
        self.soft_fail: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.recent: dict[str, deque[float]] = {}

    def arrival(self, ip: str, front: str, endpoint: str, now: float) -> None:
        self.total += 1
        self.by_front[front] += 1
        self.by_endpoint[endpoint] += 1
        self.by_ip[ip] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        times = self.recent.get(ip)
        if times is None:
            times = self.recent[ip] = deque(maxlen=MAX_TIMESTAMPS_PER_IP)
        cutoff = now - self.window_s
        while times and times[0] < cutoff:
            times.popleft()
        times.append(now)

    def done(self, status: int) -> None:
        self.in_flight -= 1
        self.by_status[str(status)] += 1

    def snapshot(self, window_s: float | None, with_timestamps: bool) -> dict[str, Any]:
        now = time.time()
        window = min(window_s or self.window_s, self.window_s)
        recent: dict[str, Any] = {}
        for ip, times in self.recent.items():
            ts = [t for t in times if t >= now - window]
            if not ts:
                continue
            entry: dict[str, Any] = {
                "count": len(ts),
                "first": ts[0],
                "last": ts[-1],
                "rate_per_s": round(len(ts) / window, 3),
                "max_in_any_1s": _max_in_window(ts, 1.0),
            }
            if with_timestamps:
                entry["timestamps"] = ts
            recent[ip] = entry
        return {
            "since": self.since,
            "now": now,
            "total": self.total,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "by_front": dict(self.by_front),
            "by_endpoint": dict(self.by_endpoint),
            "by_ip": dict(self.by_ip),
            "by_status": dict(self.by_status),
            "rejections": dict(self.rejections),
            "soft_fail": dict(self.soft_fail),
            "events": dict(self.events),
            "recent": {"window_s": window, "by_ip": recent},
        }


def _max_in_window(times: list[float], span: float) -> int:
    """Most arrivals inside any `span`-second interval (times sorted)."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= span:
            lo += 1
        best = max(best, hi - lo + 1)
    return best
