"""Adaptive throttling per site, shared by every worker: AutoThrottle's rule, held in Redis.

Scrapy's AutoThrottle keeps one delay per download slot in one process. Here every worker of
a site shares it: a hash per site in Redis holds the delay, and requests to the site start at
least that far apart whichever worker sends them (the `throttle` operation of the gate's
script, `gate.lua`, reserves the next start, as the rate tokens do). The delay follows the
measured latency:

- each response with status 200 moves the delay halfway to `latency / target concurrency`
  (straight to it when that is higher), so a site answering in `L` seconds gets about
  `THROTTLE_TARGET_CONCURRENCY` requests in flight, whatever the number of workers;
- other answers (errors, redirects, timeouts) may raise the delay, never lower it;
- a 429 or 503 doubles it (at most once per delay: the answers to requests already in flight
  say nothing new) and makes it a floor that halves every 32 answers, so the latency rule
  does not run straight back to the speed the site refused; a `Retry-After` pauses the
  whole site until then (at most `THROTTLE_MAX_RETRY_AFTER`);
- it starts at `THROTTLE_START_DELAY` and stays below `THROTTLE_MAX_DELAY`.

Cost per request: feedback is buffered in the process and rides along with the same
process's next reservation for that site, so a page costs one script call (inside the gate's
own round trip when the gate has limits for it, `RedisGate.before_request`); only 429/503
answers are sent at once, so that every worker backs off together. A slot further away than
`max_sleep` is not reserved: `Throttled` tells the task to give its worker slot back.
"""

from __future__ import annotations

import random
import time
from typing import Any

from config import Settings, get_settings
from exceptions import Throttled
from utils.keyspace import Keyspace
from utils.lua import load_lua
from utils.redis import get_redis, is_cluster

SCRIPT = load_lua(__file__, "gate.lua")  # its `throttle` operation
BACKOFF_STATUSES = frozenset((429, 503))
IDLE_EXPIRY = 86400.0  # seconds a site's learned delay outlives its last request
_MIN_RETRY = 0.05


class Throttle:
    """The per-site adaptive delay. `delay(site)` before each request (seconds to wait, the
    slot reserved), `feedback(site, latency, status, retry_after)` after its answer."""

    def __init__(
        self,
        client: Any = None,
        settings: Settings | None = None,
        *,
        max_sleep: float | None = None,
        idle_expiry: float = IDLE_EXPIRY,
    ) -> None:
        s = self.settings = settings or get_settings()
        self.r = client or get_redis(s.redis_url)
        self.max_sleep = s.gate_max_sleep if max_sleep is None else max_sleep
        self.script = self.r.register_script(SCRIPT)
        self._params = (
            repr(float(s.throttle_target_concurrency)),
            _us(s.throttle_start_delay),
            _us(s.throttle_max_delay),
            _us(s.throttle_max_retry_after),
            _us(self.max_sleep),
            max(1, round(idle_expiry * 1000)),
        )
        self.keys = Keyspace(s.key_prefix)
        self._sites_key = self.keys.throttled_sites
        # on a cluster the script stays on the site's slot and a new site joins the global
        # set of throttled sites by a command of its own (the script says when it is new)
        self._cluster = is_cluster(self.r)
        # site -> [responses with 200, their latency sum (us), worst other latency (us)];
        # taken whole by the next reservation (`dict.pop` is atomic, so a sample added in a
        # race with it is lost at worst: harmless, the next one counts)
        self._pending: dict[str, list[int]] = {}

    @classmethod
    def from_settings(cls, client: Any = None, settings: Settings | None = None) -> Throttle | None:
        """The throttle when `CHAINCRAWL_THROTTLE` is on (the default), else None."""
        s = settings or get_settings()
        return cls(client, s) if s.throttle else None

    def key(self, site: str) -> str:
        """The site's state hash, on its slot (`utils.keyspace`)."""
        return self.keys.throttle(site)

    # -- one script call: feedback, then (optionally) the next slot

    def call(
        self,
        site: str,
        reserve: bool = True,
        backoff: bool = False,
        retry_after: float | None = None,
    ) -> tuple[Any, list[str], list[Any]]:
        """`(script, keys, args)` of one update, taking this process's buffered feedback for
        the site: for `utils.redis.eval_scripts`, which can run it with other scripts."""
        n, total, other = self._pending.pop(site, None) or (0, 0, 0)
        args = [
            "throttle",
            site,
            1 if reserve else 0,
            n,
            total,
            other,
            1 if backoff else 0,
            _us(retry_after or 0.0),
            *self._params,
        ]
        keys = [self.key(site)] if self._cluster else [self.key(site), self._sites_key]
        return self.script, keys, args

    def _run(
        self,
        site: str,
        reserve: bool = True,
        backoff: bool = False,
        retry_after: float | None = None,
    ) -> Any:
        """One update on its own: `call`, run, and `heard`."""
        script, keys, args = self.call(site, reserve, backoff, retry_after)
        return self.heard(site, script(keys=keys, args=args))

    def heard(self, site: str, result: Any) -> Any:
        """A script's result, once the site it made new is in the set of throttled sites
        (on a cluster, where the script cannot reach that set); every caller of `call`
        passes the result through here (or `outcome`)."""
        if self._cluster and len(result) > 3 and int(result[3]):
            self.r.sadd(self._sites_key, site)
        return result

    def outcome(self, site: str, result: Any) -> float:
        """Seconds to wait from a reservation's result; `Throttled` when none was made."""
        self.heard(site, result)
        status, wait_us = int(result[0]), int(result[1])
        wait = wait_us / 1e6
        if status == 1:
            retry_after = max(_MIN_RETRY, wait - self.max_sleep / 2) * random.uniform(1.0, 1.3)
            raise Throttled(
                f"{site}: next request slot in {wait:.2f}s (adaptive delay or Retry-After)",
                retry_after=retry_after,
            )
        return wait

    def delay(self, site: str) -> float:
        """Reserve the site's next request start: the seconds to wait before sending (sleep
        them), or `Throttled` when that is further away than `max_sleep`. One Redis call."""
        script, keys, args = self.call(site)
        return self.outcome(site, script(keys=keys, args=args))

    def wait(self, site: str) -> None:
        """`delay(site)`, then sleep it."""
        seconds = self.delay(site)
        if seconds > 0:
            time.sleep(seconds)

    def feedback(
        self, site: str, latency: float, status: int, retry_after: float | None = None
    ) -> None:
        """Report one answer: `latency` in seconds, `status` 0 when none came (timeout,
        refused). Buffered, no Redis call, except a 429/503, which every worker must hear now.
        Answers from the development HTTP cache must not be reported (they took no time)."""
        if status in BACKOFF_STATUSES:
            self._run(site, reserve=False, backoff=True, retry_after=retry_after)
            return
        lat = max(0, round(latency * 1_000_000))
        buf = self._pending.get(site)
        if buf is None:
            buf = self._pending[site] = [0, 0, 0]
        if status == 200:
            buf[0] += 1
            buf[1] += lat
        elif lat > buf[2]:
            buf[2] = lat

    def flush(self, site: str | None = None) -> None:
        """Send buffered feedback now, reserving nothing (tests; a process about to stop)."""
        for name in [site] if site is not None else list(self._pending):
            if name in self._pending:
                self._run(name, reserve=False)

    # -- inspection (control.sh limits, metrics)

    def state(self, site: str) -> dict[str, Any] | None:
        """The site's shared state: delay, pause left, smoothed latency, floor (seconds),
        answers measured, backoffs."""
        raw = self.r.hgetall(self.key(site))
        if not raw:
            return None
        now_s, now_us = self.r.time()
        return _row(site, raw, now_s * 1_000_000 + now_us)

    def usage(self) -> list[dict[str, Any]]:
        """Every throttled site's state, by site name (sites idle past the expiry drop out)."""
        sites = sorted(
            m.decode() if isinstance(m, bytes) else m for m in self.r.smembers(self._sites_key)
        )
        if not sites:
            return []
        pipe = self.r.pipeline(transaction=False)
        for site in sites:
            pipe.hgetall(self.key(site))
        if self._cluster:  # a cluster pipeline takes only commands with keys
            states = pipe.execute()
            now_s, now_us = self.r.time()
        else:
            pipe.time()
            *states, (now_s, now_us) = pipe.execute()
        now = now_s * 1_000_000 + now_us
        gone = [site for site, raw in zip(sites, states, strict=True) if not raw]
        if gone:
            self.r.srem(self._sites_key, *gone)
        return [_row(site, raw, now) for site, raw in zip(sites, states, strict=True) if raw]


def _row(site: str, raw: dict[Any, Any], now_us: int) -> dict[str, Any]:
    h = {(k.decode() if isinstance(k, bytes) else k): int(float(v)) for k, v in raw.items()}
    return {
        "site": site,
        "delay": round(h.get("delay", 0) / 1e6, 3),
        "paused_for": round(max(0, h.get("pause", 0) - now_us) / 1e6, 3),
        "latency": round(h.get("latency", 0) / 1e6, 3),
        "samples": h.get("samples", 0),
        "backoffs": h.get("backoffs", 0),
        "floor": round(h.get("floor", 0) / 1e6, 3),
    }


def _us(seconds: float) -> int:
    return max(0, round(seconds * 1_000_000))
