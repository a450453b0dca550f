"""The admission gate every endpoint task passes: concurrency leases and request tokens.

Celery's own `rate_limit` is per worker; limits here are per site and per endpoint, held in
Redis and shared by every worker. The base task calls:

    wait = gate.admit(spec.site, spec.name, task_id)     # before running; 0.0 = admitted
    gate.before_request(spec.site, spec.name)            # before each HTTP request; may sleep
    gate.feedback(spec.site, latency, status, retry_after)  # how it went (the throttle hears it)
    gate.release(spec.site, spec.name, task_id)          # after running (always)

Work that costs far more than a request holds a place in a work scope of its site while it
runs (`ctx.render`: `holder = gate.enter(site, "render", ttl)` ... `gate.leave(site, "render",
holder)`), which may wait briefly or raise `Throttled`.

`admit` returns the seconds to wait when the task may not run yet; the base task then gives
its worker slot back (re-queues itself with that countdown, without spending a retry) unless
the wait is tiny. `before_request` blocks for short waits and raises
`exceptions.ResourceUnavailable(retry_after=...)` for long ones. Implementations register a
factory in `gates` under a name; `CHAINCRAWL_GATE` picks one: "redis" when limits are set,
including the default per-site limits (`CHAINCRAWL_DEFAULT_LIMITS`, on unless `off`), else
"noop".
"""

from __future__ import annotations

from typing import Any, Protocol

from config import Settings, get_settings
from scheduling.limits import default_limit, effective_limits, render_limit
from scheduling.ratelimit import RedisGate
from scheduling.shares import fleet_from_settings
from scheduling.throttle import Throttle
from settings.scheduling import get_fleet_settings
from utils.process import pid
from utils.registry import Registry


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
        },
        "defaults": {"limits": s.default_limits, "gate": s.gate or "auto"},
    }
