"""Client-side selection (haipproxy's py_cli): which proxies qualify, and in what order to use them.

`Selector` intersects the three indexes and relaxes step by step when too few qualify:

    1. score > lowest  AND  validated within ttl  AND  answers within longest
    2. (validated within ttl AND answers within longest)  OR  score > lowest
    3. validated within ttl  OR  score > lowest

A step is taken while fewer than `2 * client_pool_size` proxies qualify. Each step's
set contains the previous one, so relaxing never loses a proxy.

`Rotation` is the in-process client pool with haipproxy's two strategies: round-robin spreads
load evenly; greedy keeps using the head while it answers faster than `fast_response`.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from external_interface.resources.proxy.models import Event
from external_interface.resources.proxy.pool import GlobalPool
from utils.redis import as_str


@dataclass(frozen=True)
class Selection:
    ids: list[str]  # best first: fastest, then highest score
    step: int  # 1 = strict, 2 and 3 = relaxed


class Selector:
    def __init__(
        self,
        pool: GlobalPool,
        *,
        lowest_score: float | None = None,
        ttl_validated: float | None = None,
        longest_response: float | None = None,
        client_pool_size: int | None = None,
    ) -> None:
        s = pool.settings
        self.pool = pool
        self.lowest_score = s.lowest_score if lowest_score is None else lowest_score
        self.ttl_validated = s.ttl_validated if ttl_validated is None else ttl_validated
        self.longest_response = s.longest_response if longest_response is None else longest_response
        self.client_pool_size = s.client_pool_size if client_pool_size is None else client_pool_size

    def select(self, now: float | None = None) -> Selection:
        now = time.time() if now is None else now
        k = self.pool.keys
        pipe = self.pool.rds.pipeline(transaction=False)
        pipe.zrangebyscore(k.score, f"({self.lowest_score}", "+inf")
        pipe.zrangebyscore(k.checked, now - self.ttl_validated, "+inf")
        pipe.zrangebyscore(k.speed, 0, self.longest_response, withscores=True)
        scored_raw, fresh_raw, speed_raw = pipe.execute()
        scored = {as_str(x) for x in scored_raw}
        fresh = {as_str(x) for x in fresh_raw}
        speeds = {as_str(x): v for x, v in speed_raw}
        fast = set(speeds)

        want = 2 * self.client_pool_size
        steps = (
            lambda: scored & fresh & fast,
            lambda: (fresh & fast) | scored,
            lambda: fresh | scored,
        )
        chosen: set[str] = set()
        step = 0
        for step, build in enumerate(steps, start=1):  # noqa: B007 - step is reported
            chosen = build()
            if len(chosen) >= want:
                break
        return Selection(self._order(chosen, speeds), step)

    def _order(self, ids: set[str], speeds: dict[str, float]) -> list[str]:
        if not ids:
            return []
        ordered = list(ids)
        scores = self.pool.rds.zmscore(self.pool.keys.score, ordered)
        score_of = {i: (s or 0.0) for i, s in zip(ordered, scores, strict=True)}
        # the global pool prefers low latency; unknown speeds go last
        ordered.sort(key=lambda i: (speeds.get(i, float("inf")), -score_of[i], i))
        return ordered


class Rotation:
    """An in-process client pool (a queue of ids), refilled from `Selector` when it runs low.

    Not exclusive: concurrent callers may share a proxy. Use a channel pool for exclusivity.
    """

    STRATEGIES = ("robin", "greedy")

    def __init__(
        self,
        selector: Selector,
        strategy: str = "robin",
        *,
        length: int | None = None,
        fast_response: float | None = None,
    ) -> None:
        if strategy not in self.STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; use one of {self.STRATEGIES}")
        s = selector.pool.settings
        self.selector = selector
        self.strategy = strategy
        self.length = selector.client_pool_size if length is None else length
        self.fast_response = s.fast_response if fast_response is None else fast_response
        self.refresh_interval = s.refill_interval
        self.ban_ttl = s.ban_ttl
        self._queue: collections.deque[str] = collections.deque()
        # proxies this site banned, kept out until then (monotonic): the global pool still
        # ranks them healthy (other sites may use them), so a refill would bring them back
        self._benched: dict[str, float] = {}
        self._lock = threading.Lock()
        self._last_refresh = float("-inf")
        self.clock: Callable[[], float] = time.monotonic  # tests put a clock of their own

    def refresh(self) -> None:
        """Top the queue up from the global pool when it holds fewer than `length` proxies
        (at most once per `refresh_interval` while it still holds some)."""
        if len(self._queue) >= self.length:
            return
        now = self.clock()
        if self._queue and now - self._last_refresh < self.refresh_interval:
            return
        self._last_refresh = now
        fresh = self.selector.select().ids
        with self._lock:
            for pid in [p for p, until in self._benched.items() if until <= now]:
                del self._benched[pid]
            known = set(self._queue) | self._benched.keys()
            self._queue.extend(i for i in fresh if i not in known)

    def get(self, avoid: Collection[str] = ()) -> str | None:
        """The proxy to use next (skipping `avoid`), or None when none qualifies."""
        self.refresh()
        with self._lock:
            for idx, pid in enumerate(self._queue):
                if pid in avoid:
                    continue
                if self.strategy == "robin":
                    del self._queue[idx]
                    self._queue.append(pid)
                return pid
        return None

    def feedback(
        self,
        proxy_id: str,
        event: Event,
        elapsed: float | None = None,
        hold: float | None = None,
    ) -> None:
        """Failures leave the queue; a ban also keeps the proxy out of refills for `hold`
        seconds (the site's Retry-After; default and cap `ban_ttl`), as a channel benches it;
        greedy sends a slow success to the back."""
        with self._lock:
            if event is Event.BANNED:
                ttl = self.ban_ttl if hold is None else min(hold, self.ban_ttl)
                self._benched[proxy_id] = self.clock() + ttl
            if proxy_id not in self._queue:
                return
            if event in (Event.DEAD, Event.TIMEOUT, Event.BANNED):
                self._queue.remove(proxy_id)
            elif (
                self.strategy == "greedy"
                and event is Event.SUCCESS
                and elapsed is not None
                and elapsed > self.fast_response
            ):
                self._queue.remove(proxy_id)
                self._queue.append(proxy_id)

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self._queue)

    def benched(self) -> dict[str, float]:
        """Proxies this site banned -> seconds until they may come back."""
        now = self.clock()
        with self._lock:
            return {p: round(until - now, 3) for p, until in self._benched.items() if until > now}
