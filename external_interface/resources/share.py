"""A process's share of a pool it holds members of (holding.py, `hold_share`): each live
process holding from the pool keeps at most its part of the members, so the processes do not
compete for them and a request waits in its own process for one held there instead of
polling Redis.

The processes holding from a pool are counted in one sorted set beside the pool's keys, on
its first sub-pool's slot:

    <b>:holders  zset  holder -> until (unix ms)   one entry a process (a holding), refreshed
                                                   every EVERY seconds while the process takes
                                                   members (a lend from its own holding
                                                   included), counted until then + TTL

A refresh is one pipelined round trip: the process's own entry written, the entries past
their time dropped, the entries counted, and the pool's members counted (`HLEN` of each
sub-pool's secret hash). A process's share is then ceil(members / processes) (at least 1);
alone, or with no member known, it has none (it takes what it needs, as without a share).

Nothing else depends on the count: a process that crashes leaves its entry, which stops
counting TTL seconds after its last refresh (the others' shares grow back), and its leases
come back by their own expiry as before. A process that goes idle stops refreshing, so the
busy ones take its share within TTL; one that shuts down removes its entry (`leave`). The
time in an entry is the writer's clock and its expiry is judged by the reader's: clocks a few
seconds apart only move when a process stops counting. The pools' rules are untouched:
every member still goes out by its pool's exclusive checkout, from its site's pool.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time

import redis

from external_interface.resources.lease import LeasePool

log = logging.getLogger(__name__)

EVERY = 2.0  # seconds between two refreshes of a process's entry, while it takes members
TTL = 6.0  # an entry not refreshed for this long no longer counts (its process idle or gone)
SECRET = 5  # the secret hash's place in lease.KEY_NAMES: a sub-pool's members


class Share:
    """One process's share of one pool; the holding calls `cap` before it takes a member
    from the pool and when it decides whether a member given back stays held."""

    def __init__(self, pool: LeasePool) -> None:
        self.pool = pool
        self.key = holders_key(pool)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.limit: int | None = None  # the share as the last refresh found it (None: none)
        self.processes = 0  # live processes holding from the pool, as the last refresh counted
        self.members = 0  # the pool's members, likewise
        self.calls = 0  # refreshes sent (one round trip each), for tests and benchmarks
        self._due = 0.0  # monotonic: the next refresh

    def cap(self, now: float | None = None) -> int | None:
        """The most members this process may hold (None: no limit), refreshed once EVERY
        seconds; a refresh that fails keeps the last share."""
        now = time.monotonic() if now is None else now
        if now >= self._due:
            self._due = now + EVERY
            self.refresh()
        return self.limit

    def refresh(self) -> None:
        ms = int(time.time() * 1000)
        pipe = self.pool.rds.pipeline(transaction=False)
        pipe.zadd(self.key, {self.holder: ms + int(TTL * 1000)})
        pipe.zremrangebyscore(self.key, "-inf", ms)
        pipe.zcard(self.key)
        for keys in self.pool.part_keys:
            pipe.hlen(keys[SECRET])
        try:
            got = pipe.execute()
        except redis.RedisError as exc:
            log.warning("%s: share not refreshed (%s); the last one holds", self.pool.name, exc)
            return
        self.calls += 1
        self.processes, self.members = int(got[2]), sum(int(x) for x in got[3:])
        n = self.processes
        self.limit = max(1, -(-self.members // n)) if self.members and n > 1 else None

    def leave(self) -> None:
        """This process holds nothing from the pool any more (shutdown): stop counting it."""
        self.limit, self._due = None, 0.0
        try:
            self.pool.rds.zrem(self.key, self.holder)
        except redis.RedisError:
            log.warning("%s: holder entry left to expire", self.pool.name)


def holders_key(pool: LeasePool) -> str:
    """The pool's count of holding processes (on its first sub-pool's slot)."""
    return f"{pool.base}:holders"
