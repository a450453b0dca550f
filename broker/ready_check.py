"""redis-py's check of a pooled connection, without a trip through the gevent hub.

Every command takes a connection from its pool, and the pool first asks whether the
connection has unread bytes (`can_read(timeout=0)`: a reply left over, or a socket the server
closed). redis-py answers with `select.poll()`, which gevent's monkey-patching replaces by a
poll that builds an event, an io watcher and a timer and switches into the hub, even for a
zero timeout: a hub round trip per command, about one for every two pages a gevent worker
crawls (the state store's round trips, kombu's acks and the outbox drainer's reads alike).

`apply()` (a gevent worker at import, `worker.py`) answers the zero-timeout case with the
operating system's own poll, which never blocks: the same answer (readable or hung up), the
same non-destructive check, no switch. A check with a timeout (a pub/sub read waiting for a
message) goes to redis-py's as before, and blocks only its greenlet.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("chaincrawl.worker")

_applied = False


def apply() -> bool:
    """Install the check on redis-py's hiredis parser (once; a no-op without gevent's
    patching or where redis-py changed under it: True when installed)."""
    global _applied
    if _applied:
        return True
    from utils.process import gevent_patched

    if not gevent_patched():
        return False
    try:
        from gevent import monkey
        from redis._parsers import hiredis
    except ImportError:  # pragma: no cover - both are runtime dependencies of a gevent worker
        return False
    patched = getattr(hiredis, "_socket_can_read", None)
    if patched is None or not getattr(hiredis, "_HAS_POLL", False):
        log.warning("redis-py has no _socket_can_read to speed up: its own check kept")
        return False
    hiredis._socket_can_read = ready_now(patched, monkey.get_original("select", "poll"))
    _applied = True
    return True


def ready_now(fallback: Any, real_poll: Any) -> Any:
    """redis-py's `_socket_can_read(sock, timeout)` whose zero timeout polls through
    `real_poll` (the unpatched `select.poll`), anything else through `fallback`."""
    import select

    pollin = select.POLLIN

    def _socket_can_read(sock: Any, timeout: float | None) -> bool:
        if timeout != 0:  # None (block) or a wait: the greenlet waits in the hub
            return bool(fallback(sock, timeout))
        pending = getattr(sock, "pending", None)  # TLS bytes decrypted above the socket
        if pending is not None and pending():
            return True
        poller = real_poll()
        poller.register(sock, pollin)
        return bool(poller.poll(0))

    _socket_can_read.__wrapped__ = fallback  # type: ignore[attr-defined]
    return _socket_can_read
