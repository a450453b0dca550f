"""The change generator: posts whose like counts move at set rates and hours of a simulated day.

With `changes` on, every post belongs to a class of `change_classes` (`0.03:8/d` = 3 % of the
posts gain a like 8 times a day on average) and its likes grow by one at each event of a
Poisson process whose intensity follows the hour of the day (UTC): `change_hours` are the
busy hours, every other hour has `change_quiet` times their intensity, and a day's events
average the class's rate. Events start at `change_start` (simulated seconds since 1970).

Everything is deterministic from (seed, post number, day): the events of one post on one day
are drawn by thinning from their own random stream, so two servers, a test and a benchmark
computing the same post agree, and a post's count at any time costs one day's draws (the
days before are counted once and kept).

The simulated time is the server's `DemoClock`: `wall` (the time since the server started,
times `change_clock_speed`, from `change_start`) or `manual` (`POST /admin/clock` sets or
advances it; the driver of a test or benchmark moves it, never a sleep).
"""

from __future__ import annotations

import bisect
import math
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

DAY = 86_400.0
HOUR = 3_600.0
_CLASS = re.compile(r"^\s*(\d*\.?\d+)\s*:\s*(\d*\.?\d+)\s*/\s*(\d*\.?\d+)?\s*(d|day|h|hour)\s*$")


@dataclass(frozen=True)
class ChangeClass:
    share: float  # of the posts
    per_day: float  # likes gained a day, on average


def parse_classes(text: str) -> tuple[ChangeClass, ...]:
    """`0.03:8/d, 0.07:2/d, 0.9:1/30d` -> the classes (shares must add up to 1)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = _CLASS.match(part)
        if not m:
            raise ValueError(f"change class {part!r} is not like 0.03:8/d (share:events/period)")
        share, n, per, unit = float(m.group(1)), float(m.group(2)), m.group(3), m.group(4)
        period = float(per or 1) * (DAY if unit in ("d", "day") else HOUR)
        out.append(ChangeClass(share, n * DAY / period))
    if not out or abs(sum(c.share for c in out) - 1.0) > 1e-6:
        raise ValueError(f"change classes {text!r}: the shares must add up to 1")
    return tuple(out)


def parse_hours(text: str) -> frozenset[int]:
    """`8-11,19-22` -> {8, 9, 10, 11, 19, 20, 21, 22} (UTC hours, ranges inclusive)."""
    hours: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if not (0 <= a <= b <= 23):
            raise ValueError(f"change hours {part!r}: hours are 0..23, ranges low-high")
        hours.update(range(a, b + 1))
    return frozenset(hours)


class ChangeModel:
    """When each post's likes change, and its count at a time (see the module docstring)."""

    def __init__(
        self,
        seed: int,
        classes: Sequence[ChangeClass],
        hours: frozenset[int],
        quiet: float = 0.05,
        start: float = 0.0,
    ) -> None:
        self.seed, self.classes, self.start = seed, tuple(classes), float(start)
        raw = [1.0 if h in hours else quiet for h in range(24)]
        mean = sum(raw) / 24
        self.weights = tuple(w / mean for w in raw)  # average 1 over the day
        self._peak = max(self.weights)
        self._days: dict[int, list[int]] = {}  # post -> events on each whole day since start
        self._class: dict[int, ChangeClass] = {}

    def class_of(self, n: int) -> ChangeClass:
        found = self._class.get(n)
        if found is None:
            u = random.Random(f"{self.seed}/changes/class/{n}").random()
            acc, found = 0.0, self.classes[-1]
            for c in self.classes:
                acc += c.share
                if u < acc:
                    found = c
                    break
            self._class[n] = found
        return found

    def _day_events(self, n: int, day: int) -> list[float]:
        """The post's events on day `day` (days since 1970), after `start`, sorted."""
        rate = self.class_of(n).per_day / DAY  # events per second, averaged over the day
        if rate <= 0:
            return []
        rng = random.Random(f"{self.seed}/changes/{n}/{day}")
        top = rate * self._peak
        t, end, out = day * DAY, (day + 1) * DAY, list[float]()
        while True:
            t += rng.expovariate(top)
            if t >= end:
                return out
            if rng.random() * self._peak < self.weights[int(t % DAY // HOUR)] and t >= self.start:
                out.append(t)

    def events(self, n: int, t0: float, t1: float) -> list[float]:
        """Event times of post `n` in (t0, t1]."""
        out: list[float] = []
        first = math.floor(max(t0, self.start) / DAY)
        for day in range(first, math.floor(t1 / DAY) + 1):
            out += [t for t in self._day_events(n, day) if t0 < t <= t1]
        return out

    def count(self, n: int, t: float) -> int:
        """Likes post `n` gained from `start` up to time `t`."""
        if t < self.start:
            return 0
        first, day = math.floor(self.start / DAY), math.floor(t / DAY)
        done = self._days.setdefault(n, [])
        while len(done) < day - first:  # whole days before today, counted once
            done.append(len(self._day_events(n, first + len(done))))
        today = self._day_events(n, day)
        return sum(done[: day - first]) + bisect.bisect_right(today, t)


class DemoClock:
    """The server's simulated time: `wall` runs from `start` at `speed` simulated seconds per
    second since the server started; `manual` stays where `set`/`advance` put it."""

    def __init__(self, mode: str, start: float, speed: float = 1.0) -> None:
        if mode not in ("wall", "manual"):
            raise ValueError(f"clock mode {mode!r}: wall or manual")
        self.mode, self.speed = mode, speed
        self._start, self._t0 = float(start), time.monotonic()
        self._now = float(start)

    def now(self) -> float:
        if self.mode == "wall":
            return self._start + (time.monotonic() - self._t0) * self.speed
        return self._now

    def set(self, t: float) -> float:
        if self.mode != "manual":
            raise ValueError("the clock runs by itself (change_clock=wall): set it to manual")
        self._now = float(t)
        return self._now

    def advance(self, seconds: float) -> float:
        return self.set(self.now() + seconds)
