"""The admission gate every endpoint task passes: shared rate limits and concurrency caps,
held in Redis and obeyed by every worker together.

Celery's own `rate_limit` is per worker; limits here are per site, per platform or per
endpoint (a dotted prefix of the task name), in `CHAINCRAWL_LIMITS`, inline or as a YAML/JSON
file (syntax: docs/scheduling.md; read by `scheduling/limits.py`):

    CHAINCRAWL_LIMITS="demo=20/s,8; demo.h5.feed=5/s; *=10/s"

A task passes every limit whose scope is a prefix of its name (`demo` and `demo.h5.feed` for
`demo.h5.feed`); `*` is the default for each site that has no entry of its own. The base task
calls:

    wait = gate.admit(spec.site, spec.name, task_id)     # before running; 0.0 = admitted
    gate.before_request(spec.site, spec.name)            # before each HTTP request; may sleep
    gate.feedback(spec.site, latency, status, retry_after)  # how it went (the throttle hears it)
    gate.release(spec.site, spec.name, task_id)          # after running (always)

`admit` returns the seconds to wait when the task may not run yet; the base task then gives
its worker slot back (re-queues itself with that countdown, without spending a retry) unless
the wait is tiny. `before_request` blocks for short waits and raises `Throttled` for long
ones. Implementations register a factory in `gates` under a name; `CHAINCRAWL_GATE` picks one:
"redis" when limits are set, including the default per-site limits
(`CHAINCRAWL_DEFAULT_LIMITS`, on unless `off`), else "noop".

Rate = a GCRA token bucket (one key per scope: the "theoretical arrival time" in microseconds
of Redis server time). A request reserves its slot atomically on every scope it passes and
sleeps until then; waits beyond `max_sleep` reserve nothing and raise `Throttled`, so the
task gives its worker slot back. Because requests are spaced by reservation, not by polling,
the combined rate of any number of workers stays at the limit.

Concurrency = leases: a sorted set per scope of task ids scored by expiry time. The admit
script purges expired leases first, so a SIGKILLed worker's slots come back after the lease
TTL; every request renews the running task's leases, so a live task never loses its slot.
Every script reads the clock with `TIME` inside Redis: workers on different machines agree.

Work scopes: some work costs far more than a request, so it has a scope of its own per site,
taken around the work itself rather than around the task. A rendered page holds a place in
`<site>.render` while the browser renders it (`holder = gate.enter(site, "render", ttl)` ...
`gate.leave(site, "render", holder)`, which may wait briefly or raise `Throttled`): its
`CHAINCRAWL_LIMITS` entry (`demo.render=2` or `demo.render=1/s,2`), else
`CHAINCRAWL_BROWSER_SITE_LIMIT` (4 in flight).
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from config import Settings, get_settings
from exceptions import Throttled
from scheduling.limits import Limit, default_limit, effective_limits, render_limit
from scheduling.shares import fleet_from_settings
from scheduling.throttle import Throttle
from settings.scheduling import get_fleet_settings
from utils.keyspace import Keyspace
from utils.lua import load_lua
from utils.process import pid
from utils.redis import get_redis
from utils.registry import Registry

LEASE_MARGIN = 15.0  # seconds a default lease outlives the task deadline (hard limit is +15)
TINY_WAIT = 0.05  # admit waits this short are slept inside the worker, not re-queued
RENDER = "render"  # the work scope of a site's rendered pages: `<site>.render`

# the gate's script: `admit` takes a task's concurrency leases (or says how long to wait);
# `token` reserves a request's slot on every rate scope and renews the running task's leases;
# `request` does that and the throttle's reservation (throttle.py) in one call. KEYS/ARGV in
# the file.
_GATE = load_lua(__file__, "gate.lua")


class FleetShares(Protocol):
    """A fleet-wide budget shared between sites (scheduling/shares.py `Fleet`)."""

    def takes_part(self, site: str) -> bool: ...

    def take_task(self, site: str, task_id: str, ttl: float) -> bool: ...

    def give_task(self, site: str, task_id: str) -> None: ...

    def rate_of(self, site: str) -> float | None: ...


FLEET_SCOPE = "@fleet"  # `<site>.@fleet`: the rate key of a site's share of the fleet rate


@dataclass(frozen=True)
class _Plan:
    """What one endpoint must pass: its lease keys and its rate keys, precomputed."""

    lease_keys: tuple[str, ...]
    lease_args: tuple[int, ...]  # cap, ttl_us per lease key
    lease_ttls: tuple[int, ...]
    rate_keys: tuple[str, ...]
    rate_args: tuple[int, ...]  # interval_us, tolerance_us per rate key

    @property
    def empty(self) -> bool:
        return not self.lease_keys and not self.rate_keys


class RedisGate:
    """The `redis` gate: every worker shares the limits through one Lua script (gate.lua).

    `max_sleep` (CHAINCRAWL_GATE_MAX_SLEEP, default 1 s): the longest a request waits for
    its token inside the task; longer waits re-queue the task. `retry` (CHAINCRAWL_GATE_RETRY,
    default 0.5 s): the countdown, with jitter, of a task refused by a full concurrency cap.
    Without `limits`, the gate obeys `effective_limits` (the settings, with the default `*`).
    With a `throttle` (scheduling/throttle.py), `before_request` also reserves the site's
    adaptive slot, in the same round trip as the tokens. `render`: the limit of each site's
    render scope that `limits` does not name (without `limits`: CHAINCRAWL_BROWSER_SITE_LIMIT).
    """

    def __init__(
        self,
        limits: Mapping[str, Limit] | None = None,
        *,
        settings: Settings | None = None,
        client: Any = None,
        max_sleep: float | None = None,
        retry: float | None = None,
        throttle: Throttle | None = None,
        render: Limit | None = None,
        fleet: FleetShares | None = None,
    ) -> None:
        self.settings = settings or get_settings()
        s = self.settings
        self.keys = Keyspace(s.key_prefix)
        self.limits = dict(effective_limits(s) if limits is None else limits)
        if render is None and limits is None:  # given limits are the whole set: no default
            render = render_limit()
        self.render_default = render  # each site's `<site>.render` scope without an entry
        self.throttle = throttle
        self.fleet = fleet
        self.r = client or get_redis(s.redis_url)
        self.max_sleep = s.gate_max_sleep if max_sleep is None else max_sleep
        self.retry = s.gate_retry if retry is None else retry
        self._script = self.r.register_script(_GATE)
        self._plans: dict[str, _Plan] = {}
        self._local = threading.local()

    def _admit(self, keys: list[str], args: list[Any]) -> Any:
        """One `admit` call of the script (ARGV start with "admit"): the one place the
        leases are asked for, which tests count."""
        return self._script(keys=keys, args=args)

    def _args(self, op: str, holder: str, first: int, second: int, *rest: Any) -> list[Any]:
        """The script's ARGV: the operation, the holder (a task id, an `enter`'s id), how many
        keys of each kind in the order KEYS lists them, max_sleep, then each kind's arguments."""
        return [op, holder, first, second, _us(self.max_sleep), *rest]

    # scopes and keys

    def scopes(self, site: str, endpoint: str) -> list[Limit]:
        """Every configured limit the endpoint passes, broadest first. The endpoint's name
        must start with its site: every scope's keys then carry that site's hash tag, so one
        script reaches them all on a Redis Cluster."""
        parts = endpoint.split(".")
        if parts[0] != site:
            raise ValueError(f"endpoint {endpoint!r} is not of site {site!r} (its first part)")
        names = [".".join(parts[: i + 1]) for i in range(len(parts))]
        if site not in names:
            names.insert(0, site)
        found = [self.limits[n] for n in names if n in self.limits]
        if site not in self.limits and "*" in self.limits:
            found.insert(0, dataclasses.replace(self.limits["*"], scope=site))
        return found

    def key(self, scope: str, kind: str) -> str:
        """A scope's `leases` or `tat` key, tagged with its site (`utils.keyspace`)."""
        return self.keys.limit(scope, kind)

    def work_scope(self, site: str, work: str) -> Limit | None:
        """The limit of a site's work scope (`demo.render`): its own entry, else the default
        for that work (renders: `render_default`), else None."""
        name = f"{site}.{work}"
        lim = self.limits.get(name)
        if lim is None and work == RENDER and self.render_default is not None:
            lim = dataclasses.replace(self.render_default, scope=name)
        return lim

    def _plan(self, site: str, endpoint: str, deadline: float | None = None) -> _Plan:
        plan = self._plans.get(endpoint)
        if plan is not None:
            return plan
        lease_keys: list[str] = []
        lease_args: list[int] = []
        ttls: list[int] = []
        rate_keys: list[str] = []
        rate_args: list[int] = []
        for lim in self.scopes(site, endpoint):
            if lim.max is not None:
                ttl = _us(lim.lease or self._default_lease(deadline))
                lease_keys.append(self.key(lim.scope, "leases"))
                lease_args += [lim.max, ttl]
                ttls.append(ttl)
            if lim.rate is not None:
                interval = 1.0 / lim.rate
                rate_keys.append(self.key(lim.scope, "tat"))
                rate_args += [_us(interval), _us(interval * (lim.burst - 1))]
        plan = _Plan(
            tuple(lease_keys), tuple(lease_args), tuple(ttls), tuple(rate_keys), tuple(rate_args)
        )
        self._plans[endpoint] = plan
        return plan

    def _default_lease(self, deadline: float | None) -> float:
        """Longer than the task can live: its deadline plus the hard time limit's margin."""
        return (deadline or self.settings.task_deadline) + LEASE_MARGIN

    # the Gate interface

    def admit(self, site: str, endpoint: str, task_id: str, deadline: float | None = None) -> float:
        """0.0 when the task may run now (its leases taken), else seconds to wait first.
        `deadline`: the endpoint's own task deadline, when it sets one (its leases outlive it).
        A site in the fleet budget first takes its place among the fleet's tasks."""
        fleet = self.fleet if self.fleet is not None and self.fleet.takes_part(site) else None
        if fleet is not None and not fleet.take_task(site, task_id, self._default_lease(deadline)):
            return max(TINY_WAIT, self.retry * random.uniform(0.5, 1.5))
        wait = self._admit_scopes(site, endpoint, task_id, deadline)
        if wait > 0 and fleet is not None:
            fleet.give_task(site, task_id)
        return wait

    def _admit_scopes(
        self, site: str, endpoint: str, task_id: str, deadline: float | None
    ) -> float:
        plan = self._plan(site, endpoint, deadline)
        if plan.empty:
            return 0.0
        keys = [*plan.lease_keys, *plan.rate_keys]
        args = self._args(
            "admit",
            task_id,
            len(plan.lease_keys),
            len(plan.rate_keys),
            *plan.lease_args,
            *plan.rate_args,
        )
        for _ in range(3):
            status, backlog_us = self._admit(keys=keys, args=args)
            if status == 0:
                self._local.task_id = task_id
                return 0.0
            if status == 1:
                wait = self.retry * random.uniform(0.5, 1.5)
            else:  # come back when the backlog has drained to about half of max_sleep
                wait = max(0.0, backlog_us / 1e6 - self.max_sleep / 2) * random.uniform(1.0, 1.3)
            if wait >= TINY_WAIT:
                return wait
            time.sleep(wait)
        return TINY_WAIT

    def before_request(self, site: str, endpoint: str) -> None:
        """Take a token on every rate scope (sleeping until its slot), renew the task's leases
        and, with a throttle, reserve the site's adaptive slot: one round trip for all. Raise
        Throttled when a slot is further away than max_sleep."""
        plan = self._plan(site, endpoint)
        rate_keys, rate_args = plan.rate_keys, plan.rate_args
        share = self.fleet.rate_of(site) if self.fleet is not None else None
        if share:  # the site's share of the fleet rate, beside its own limits
            rate_keys = (*rate_keys, self.key(f"{site}.{FLEET_SCOPE}", "tat"))
            rate_args = (*rate_args, _us(1.0 / share), 0)
        throttle = self.throttle
        token: Any = None
        wait = 0.0
        if rate_keys or plan.lease_keys:
            tid = getattr(self._local, "task_id", "") or ""
            keys = [*rate_keys, *plan.lease_keys]
            args = self._args(
                "token" if throttle is None else "request",
                tid,
                len(rate_keys),
                len(plan.lease_keys),
                *rate_args,
                *plan.lease_ttls,
            )
            if throttle is None:
                token = self._script(keys=keys, args=args)
            else:  # both in one call; a slot one side reserved when the other refuses is
                # left unused: the request goes later, never sooner
                _, tkeys, targs = throttle.call(site)
                token, adaptive = self._script(keys=[*keys, *tkeys], args=[*args, *targs[1:]])
                wait = throttle.outcome(site, adaptive)  # raises Throttled past max_sleep
        elif throttle is not None:
            script, tkeys, targs = throttle.call(site)
            wait = throttle.outcome(site, script(keys=tkeys, args=targs))
        if token is not None:
            status, wait_us = token
            if status != 0:
                slot = wait_us / 1e6
                retry_after = max(TINY_WAIT, slot - self.max_sleep / 2) * random.uniform(1.0, 1.3)
                raise Throttled(
                    f"{endpoint}: next request slot in {slot:.2f}s (over its shared rate limit)",
                    retry_after=retry_after,
                )
            wait = max(wait, wait_us / 1e6)
        if wait > 0:
            time.sleep(wait)

    def feedback(self, site: str, latency: float, status: int, retry_after: float | None) -> None:
        """An answer for the throttle (status 0: none came); buffered, sent with the next
        reservation, except a 429/503, which every worker hears at once."""
        if self.throttle is not None:
            self.throttle.feedback(site, latency, status, retry_after)

    def enter(self, site: str, work: str, ttl: float) -> str | None:
        """Take a place in the site's `work` scope (`demo.render`) for work lasting at most
        `ttl` seconds (its lease expires then, should the worker die, unless the entry sets
        `lease=`). Returns the holder id for `leave`, or None when no limit applies. A full cap
        is asked again until `max_sleep` has passed, then `Throttled` re-queues the task; a
        rate slot further away than `max_sleep` does the same, a nearer one is slept."""
        lim = self.work_scope(site, work)
        if lim is None:
            return None
        holder = uuid.uuid4().hex
        leases = [self.key(lim.scope, "leases")] if lim.max is not None else []
        rates = [self.key(lim.scope, "tat")] if lim.rate is not None else []
        ttl_us = _us(lim.lease or ttl)
        lease_args = [lim.max, ttl_us] if lim.max is not None else []  # as `leases`
        interval = 1.0 / lim.rate if lim.rate is not None else 0.0
        rate_args = [_us(interval), _us(interval * (lim.burst - 1))] if rates else []
        give_up = time.monotonic() + self.max_sleep
        while True:
            status, backlog_us = self._admit(
                keys=[*leases, *rates],
                args=self._args("admit", holder, len(leases), len(rates), *lease_args, *rate_args),
            )
            if status == 0:
                break
            if status == 1:
                wait = self.retry * random.uniform(0.5, 1.5)
                why = f"{lim.scope}: {lim.max} in flight, its cap"
            else:
                wait = max(TINY_WAIT, backlog_us / 1e6 - self.max_sleep / 2)
                why = f"{lim.scope}: next slot in {backlog_us / 1e6:.2f}s (over its rate)"
            if time.monotonic() + wait > give_up:
                raise Throttled(why, retry_after=wait * random.uniform(1.0, 1.3))
            time.sleep(wait)
        if rates:  # reserve the rate slot, as a request takes its token
            status, wait_us = self._script(
                keys=[*rates, *leases],
                args=self._args(
                    "token",
                    holder,
                    len(rates),
                    len(leases),
                    *rate_args,
                    *([ttl_us] if leases else []),
                ),
            )
            if status != 0:
                self.leave(site, work, holder)
                raise Throttled(
                    f"{lim.scope}: next slot in {wait_us / 1e6:.2f}s (over its rate)",
                    retry_after=max(TINY_WAIT, wait_us / 1e6 - self.max_sleep / 2),
                )
            if wait_us > 0:
                time.sleep(wait_us / 1e6)
        return holder

    def leave(self, site: str, work: str, holder: str | None) -> None:
        """Give back the place `enter` took (nothing for None)."""
        lim = self.work_scope(site, work) if holder is not None else None
        if holder is not None and lim is not None and lim.max is not None:
            self.r.zrem(self.key(lim.scope, "leases"), holder)

    def release(self, site: str, endpoint: str, task_id: str) -> None:
        plan = self._plan(site, endpoint)
        if getattr(self._local, "task_id", None) == task_id:
            self._local.task_id = ""
        if self.fleet is not None and self.fleet.takes_part(site):
            self.fleet.give_task(site, task_id)
        if plan.lease_keys:
            pipe = self.r.pipeline(transaction=False)
            for key in plan.lease_keys:
                pipe.zrem(key, task_id)
            pipe.execute()

    # inspection (control.sh limits, tests)

    def usage(self) -> list[dict[str, Any]]:
        """Per configured scope: its limits, leases held now, seconds of reserved backlog."""
        now_s, now_us = self.r.time()
        now = now_s * 1_000_000 + now_us
        rows = []
        for lim in self.limits.values():
            in_flight = None
            if lim.scope == "*":  # held under each site's own keys
                rows.append(
                    {"scope": "*", "limits": lim.describe(), "in_flight": None, "backlog": 0.0}
                )
                continue
            if lim.max is not None:
                in_flight = self.r.zcount(self.key(lim.scope, "leases"), now, "+inf")
            backlog = 0.0
            if lim.rate is not None:
                tat = int(float(self.r.get(self.key(lim.scope, "tat")) or 0))
                backlog = max(0.0, (tat - now) / 1e6)
            rows.append(
                {
                    "scope": lim.scope,
                    "limits": lim.describe(),
                    "in_flight": in_flight,
                    "backlog": round(backlog, 3),
                }
            )
        return rows


def _us(seconds: float) -> int:
    return math.ceil(seconds * 1_000_000)


# --- the gate by name ---------------------------------------------------------------------


class Gate(Protocol):
    def admit(
        self, site: str, endpoint: str, task_id: str, deadline: float | None = None
    ) -> float: ...

    def before_request(self, site: str, endpoint: str) -> None: ...

    def feedback(
        self, site: str, latency: float, status: int, retry_after: float | None
    ) -> None: ...

    def release(self, site: str, endpoint: str, task_id: str) -> None: ...

    def enter(self, site: str, work: str, ttl: float) -> str | None: ...

    def leave(self, site: str, work: str, holder: str | None) -> None: ...


class NoopGate:
    """No limits: every task is admitted at once."""

    def admit(self, site: str, endpoint: str, task_id: str, deadline: float | None = None) -> float:
        return 0.0

    def before_request(self, site: str, endpoint: str) -> None:
        return None

    def feedback(self, site: str, latency: float, status: int, retry_after: float | None) -> None:
        return None

    def release(self, site: str, endpoint: str, task_id: str) -> None:
        return None

    def enter(self, site: str, work: str, ttl: float) -> str | None:
        return None

    def leave(self, site: str, work: str, holder: str | None) -> None:
        return None


def _redis_gate() -> RedisGate:
    """The shared limits, with the adaptive per-site throttle when it is on (the default) and
    the fleet budget's shares when one is set (CHAINCRAWL_FLEET_BUDGET)."""
    return RedisGate(throttle=Throttle.from_settings(), fleet=fleet_from_settings())


gates: Registry = Registry("gate")
gates.add("noop", NoopGate)
gates.add("redis", _redis_gate)

_gate: Gate | None = None
_gate_pid: int | None = None


def get_gate() -> Gate:
    """The process's gate, built once per process from CHAINCRAWL_GATE (default: redis when
    limits, default limits, the throttle, the per-site render cap or a fleet budget are on,
    else noop)."""
    global _gate, _gate_pid
    if _gate is None or _gate_pid != pid():
        s = get_settings()
        polite = (
            s.limits
            or default_limit(s) is not None
            or s.throttle
            or render_limit() is not None
            or get_fleet_settings().budget.strip()
        )
        name = s.gate or ("redis" if polite else "noop")
        _gate = gates.get(name)()
        _gate_pid = pid()
    return _gate


def reset_gate() -> None:
    global _gate
    _gate = None


def politeness_report(settings: Settings | None = None) -> dict[str, Any]:
    """What `control.sh limits` shows: every limit workers obey (the default `*` entry
    included) with live usage, the adaptive delay per site, robots.txt, and the defaults
    behind them, so a user sees what polite-by-default means on their deployment."""
    s = settings or get_settings()
    limits = effective_limits(s)
    throttle = Throttle.from_settings(None, s)
    render = render_limit()
    return {
        "limits": RedisGate(limits, settings=s).usage() if limits else [],
        "render": {
            "default": render.describe() if render is not None else "off",
            "scopes": sorted(n for n in limits if n.endswith(".render")),
        },
        "throttle": {
            "on": throttle is not None,
            "target_concurrency": s.throttle_target_concurrency,
            "start_delay": s.throttle_start_delay,
            "max_delay": s.throttle_max_delay,
            "max_retry_after": s.throttle_max_retry_after,
            "sites": throttle.usage() if throttle is not None else [],
        },
        "robots": {
            "on": s.robots,
            "user_agent": s.robots_user_agent,
            "ignored_sites": sorted(x.strip() for x in s.robots_ignore.split(",") if x.strip()),
            "ttl": s.robots_ttl,
            "error_ttl": s.robots_error_ttl,
            "unreachable_ttl": min(s.robots_unreachable_ttl, s.robots_error_ttl),
        },
        "defaults": {"limits": s.default_limits, "gate": s.gate or "auto"},
    }
