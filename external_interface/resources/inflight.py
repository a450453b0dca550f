"""The leases this process lent to requests in flight, of every kind: the fetch layer hands
the same request to a provider's `prepare`, `feedback` and `cancel`, and the lease must be
found again there (or given back when a later provider refuses), whichever provider instance
took it. Apart from the pool engine (`lease.py`) because it is the providers' side.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from external_interface.resources.base import OutgoingRequest
from external_interface.resources.lease import Lease, LeasePool

log = logging.getLogger("external_interface.resources.lease")


@dataclass
class _Held:
    pool: LeasePool
    lease: Lease
    at: float


class LeasesInFlight:
    """The leases this process lent for requests in flight, of every kind, keyed by
    (kind, request): the fetch layer hands the same request object to `prepare`, `feedback`
    and `cancel`, and any provider instance must find the lease another one took. Only opaque
    ids reach `req.leases` and the logs."""

    def __init__(self, limit: int = 2000, max_age: float = 3600.0) -> None:
        self._held: dict[tuple[str, int], _Held] = {}
        self._lock = threading.Lock()
        self.limit, self.max_age = limit, max_age

    def put(self, req: OutgoingRequest, pool: LeasePool, lease: Lease) -> None:
        with self._lock:
            if len(self._held) > self.limit:  # requests that never got feedback: long expired
                old = time.monotonic() - self.max_age
                for k in [k for k, v in self._held.items() if v.at < old]:
                    del self._held[k]
            self._held[(pool.kind, id(req))] = _Held(pool, lease, time.monotonic())
        req.leases[pool.kind] = lease.id

    def take(self, req: OutgoingRequest, pool: LeasePool) -> tuple[LeasePool, Lease] | None:
        """The lease lent for `req` from `pool`'s kind, or for a copy of `req` (the one lease of
        the same pool and member id), removed from the registry."""
        with self._lock:
            held = self._held.pop((pool.kind, id(req)), None)
            if held is None and (mid := req.leases.get(pool.kind)):
                keys = [
                    k
                    for k, v in self._held.items()
                    if k[0] == pool.kind and v.lease.id == mid and v.pool.base == pool.base
                ]
                if len(keys) == 1:
                    held = self._held.pop(keys[0])
        return (held.pool, held.lease) if held is not None else None

    def take_all(self, req: OutgoingRequest) -> list[tuple[LeasePool, Lease]]:
        with self._lock:
            keys = [k for k in self._held if k[1] == id(req)]
            return [(h.pool, h.lease) for h in (self._held.pop(k) for k in keys)]


IN_FLIGHT = LeasesInFlight()


def cancel_leases(req: OutgoingRequest) -> None:
    """Give back unused every lease this process lent `req` (a later provider could not lend,
    so the request is never sent); a failed give-back returns when its lease expires."""
    for pool, lease in IN_FLIGHT.take_all(req):
        try:
            pool.cancel(lease)
        except redis.RedisError:
            log.warning(
                "%s %s: cancel failed; it returns when its lease expires", pool.kind, lease.id
            )
        req.leases.pop(pool.kind, None)


def avoided(task: Any, kind: str) -> set[str]:
    """Member ids of `kind` this task must not get again (`task.avoid` holds "kind:id")."""
    p = f"{kind}:"
    return {a[len(p) :] for a in getattr(task, "avoid", ()) or () if a.startswith(p)}


def avoid_next_time(task: Any, kind: str, member_id: str) -> None:
    """Put a member that failed into `task.avoid`, so the retry (or the next request of the
    same attempt) gets another."""
    avoid = getattr(task, "avoid", None)
    if isinstance(avoid, set):
        avoid.add(f"{kind}:{member_id}")
