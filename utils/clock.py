"""The clock the change-driven scheduler reads: the wall clock, or a simulated one that tests
and benchmarks move forward (fast-forwarded days without a single sleep).

    clock = make_clock("wall")                 # time.time
    clock = make_clock("redis", client, key)   # seconds held in a Redis key, set by the driver
    SimClock(client, key).set(t0); ...; SimClock(client, key).advance(300)

Every process of a deployment must read the same clock: a worker observing a change and the
scheduler planning the next visit compare times. The simulated one lives in the state store,
so the workers, the beat trigger and the test driving them agree without talking to each other.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from utils.registry import Registry


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since 1970 (UTC)."""
        ...


class WallClock:
    """`time.time()`: what every deployment uses."""

    def now(self) -> float:
        return time.time()


class SimClock:
    """A simulated clock held in one Redis key (seconds, a float as text). Reading it before
    anyone set it is an error: a driver that forgot to start the clock would otherwise see 1970."""

    def __init__(self, client: Any, key: str) -> None:
        self.client, self.key = client, key

    def now(self) -> float:
        raw = self.client.get(self.key)
        if raw is None:
            raise RuntimeError(f"the simulated clock {self.key!r} was never set (SimClock.set)")
        return float(raw)

    def set(self, t: float) -> None:
        self.client.set(self.key, repr(float(t)))

    def advance(self, seconds: float) -> float:
        """Move the clock forward; returns the new time."""
        return float(self.client.incrbyfloat(self.key, seconds))


clocks: Registry[Callable[..., Clock]] = Registry("clock")
clocks.add("wall", lambda *_args, **_kw: WallClock())
clocks.add("redis", SimClock)


def make_clock(name: str, *args: Any) -> Clock:
    """The clock registered under `name` ("wall", or "redis" with a client and its key)."""
    return clocks.get(name)(*args)
