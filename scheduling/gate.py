"""The admission gate every endpoint task passes: concurrency leases and request tokens.

Celery's own `rate_limit` is per worker; limits here are per site and per endpoint, held in
Redis and shared by every worker. The base task calls:

    wait = gate.admit(spec.site, spec.name, task_id)     # before running; 0.0 = admitted
    gate.before_request(spec.site, spec.name)            # before each HTTP request; may sleep
    gate.release(spec.site, spec.name, task_id)          # after running (always)

`admit` returns the seconds to wait when the task may not run yet; the base task then gives
its worker slot back (re-queues itself with that countdown, without spending a retry) unless
the wait is tiny. `before_request` blocks for short waits and raises
`exceptions.ResourceUnavailable(retry_after=...)` for long ones. Implementations register a
factory in `gates` under a name; `CHAINCRAWL_GATE` picks one ("noop" when no limits are set).
"""

from __future__ import annotations

import os
from typing import Protocol

from utils.registry import Registry


class Gate(Protocol):
    def admit(self, site: str, endpoint: str, task_id: str) -> float: ...

    def before_request(self, site: str, endpoint: str) -> None: ...

    def release(self, site: str, endpoint: str, task_id: str) -> None: ...


class NoopGate:
    """No limits: every task is admitted at once."""

    def admit(self, site: str, endpoint: str, task_id: str) -> float:
        return 0.0

    def before_request(self, site: str, endpoint: str) -> None:
        return None

    def release(self, site: str, endpoint: str, task_id: str) -> None:
        return None


gates: Registry = Registry("gate")
gates.add("noop", NoopGate)

_gate: Gate | None = None
_gate_pid: int | None = None


def get_gate() -> Gate:
    """The process's gate, built once per process from CHAINCRAWL_GATE (default: redis when
    limits are configured, else noop)."""
    global _gate, _gate_pid
    if _gate is None or _gate_pid != os.getpid():
        try:
            import scheduling.ratelimit  # noqa: F401 - registers "redis"
        except ImportError as exc:
            if exc.name != "scheduling.ratelimit":
                raise
        name = os.environ.get("CHAINCRAWL_GATE", "")
        if not name:
            from config import get_settings

            name = "redis" if "redis" in gates and get_settings().limits else "noop"
        _gate = gates.get(name)()
        _gate_pid = os.getpid()
    return _gate


def reset_gate() -> None:
    global _gate
    _gate = None
