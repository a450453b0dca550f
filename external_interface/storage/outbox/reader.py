"""The drainer's blocking reads on a connection of their own, which a stop can end at once.

An idle drainer blocks on XREADGROUP for up to `MAX_IDLE_BLOCK` seconds (drainer.py): one
command per block, however long. A stop must not wait that out (a warm shutdown flushes
and exits), so the blocking reads go through one connection whose Redis client id is known
(`CLIENT ID`, asked once per socket), and `unblock()` ends the read in flight from another
connection (`CLIENT UNBLOCK`): Redis answers it as a timeout, so nothing is read and nothing
is left pending. The id and the UNBLOCK retries are utils/redis.py's, as for kombu's long
BRPOP (broker/kombu_guard.py).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from utils.redis import known_client_id, socket_client_id, unblock_client

log = logging.getLogger("external_interface.storage.outbox")


class BlockingReader:
    """`xreadgroup` through a connection of its own (taken from `client`'s pool); `unblock()`
    from any other thread ends a blocked one. A client without a pool (a cluster, a fake)
    reads through `client` itself, and `unblock()` does nothing."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._own: redis.Redis | None = None
        self._reading = threading.Event()
        self.stopping = False  # set by unblock(): a read that starts now does not block

    def xreadgroup(self, *args: Any, **kw: Any) -> Any:
        conn = self._connection()
        if conn is None:
            return self.client.xreadgroup(*args, **kw)
        self._reading.set()
        try:
            if self.stopping and kw.get("block"):
                kw["block"] = 1
            return conn.xreadgroup(*args, **kw)
        finally:
            self._reading.clear()

    def _connection(self) -> redis.Redis | None:
        pool = getattr(self.client, "connection_pool", None)
        if not isinstance(pool, redis.ConnectionPool):
            return None
        if self._own is None:
            self._own = redis.Redis(connection_pool=pool, single_connection_client=True)
        own = self._own.connection
        if own is None:
            return None
        socket_client_id(own, "the outbox drainer's reads block briefly")
        return self._own

    @property
    def unblockable(self) -> bool:
        """Whether a long block can be ended by `unblock()` (else the drainer keeps it short)."""
        return self._cid() is not None

    def _cid(self) -> int | None:
        """The reading connection's client id, if known for its current socket."""
        return known_client_id(getattr(self._own, "connection", None))

    def longest(self, wanted: float, short: float) -> float:
        """The longest block to ask for: `wanted` once `unblock()` can end it, else `short`;
        under two thirds of the connection's socket timeout either way (a block the socket
        outwaits would fail as a timeout)."""
        block = wanted if self.unblockable else short
        conn = getattr(self._own, "connection", None)
        timeout = getattr(conn, "socket_timeout", None)
        return min(block, 2 * timeout / 3) if timeout else block

    def unblock(self) -> bool:
        """End the read in flight, if any (-> whether one was ended), and keep the reads
        that follow from blocking (`stopping`); a read about to block is unblocked again
        until it returns."""
        self.stopping = True
        cid = self._cid()
        if cid is None or not self._reading.is_set():
            return False

        def still_blocked(wait: float) -> bool:  # the read has not returned after `wait`
            time.sleep(wait)
            return self._reading.is_set()

        try:
            return unblock_client(self.client, cid, still_blocked)
        except redis.RedisError as exc:  # Redis down: the read ends with its own error
            log.debug("outbox drainer: read not unblocked: %s", exc)
        return False

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None
