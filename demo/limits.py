"""Sliding-window counters and the per-IP rate limiter with strikes and bans."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


class SlidingWindow:
    """Event times within the last `window_s` seconds (times from one monotonic clock)."""

    __slots__ = ("events", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.events: deque[float] = deque()

    def count(self, now: float) -> int:
        cutoff = now - self.window_s
        events = self.events
        while events and events[0] <= cutoff:
            events.popleft()
        return len(events)

    def add(self, now: float) -> int:
        """Record an event; the count including it."""
        n = self.count(now) + 1
        self.events.append(now)
        return n

    def clear(self) -> None:
        self.events.clear()


@dataclass
class _Client:
    hits: SlidingWindow
    strikes: SlidingWindow
    banned_until: float = 0.0


@dataclass
class RateLimiter:
    """`limit` requests per `window_s` per key; `ban_after` 429s in `strike_window_s` -> ban.

    Rejected requests do not count against the window, so a client that slows down
    recovers at once; one that keeps hammering collects strikes and gets banned.
    """

    limit: int
    window_s: float
    ban_after: int
    strike_window_s: float
    ban_s: float
    clients: dict[str, _Client] = field(default_factory=dict)
    bans_total: int = 0

    def check(self, key: str, now: float) -> tuple[str, float]:
        """("ok" | "limited" | "banned", retry_after seconds)."""
        c = self.clients.get(key)
        if c is None:
            c = self.clients[key] = _Client(
                SlidingWindow(self.window_s), SlidingWindow(self.strike_window_s)
            )
        if c.banned_until:
            if now < c.banned_until:
                return "banned", c.banned_until - now
            c.banned_until = 0.0
            c.strikes.clear()
        if c.hits.count(now) < self.limit:
            c.hits.add(now)
            return "ok", 0.0
        if self.ban_after and c.strikes.add(now) >= self.ban_after:
            c.banned_until = now + self.ban_s
            c.strikes.clear()
            c.hits.clear()
            self.bans_total += 1
            return "banned", self.ban_s
        return "limited", c.hits.events[0] + self.window_s - now

    def banned_now(self, now: float) -> dict[str, float]:
        return {
            k: round(c.banned_until - now, 3)
            for k, c in self.clients.items()
            if c.banned_until > now
        }

    def reset(self) -> None:
        self.clients.clear()
        self.bans_total = 0
