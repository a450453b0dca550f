"""The drainer's blocking reads on a connection of their own, which a stop can end at once.

An idle drainer blocks on XREADGROUP for up to `MAX_IDLE_BLOCK` seconds (drainer.py): one
command per block, however long. A stop must not wait that out (a warm shutdown flushes
and exits), so the blocking reads go through one connection whose Redis client id is known
(`CLIENT ID`, asked once per socket), and `unblock()` ends the read in flight from another
connection (`CLIENT UNBLOCK`): Redis answers it as a timeout, so nothing is read and nothing
is left pending.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

log = logging.getLogger("external_interface.storage.outbox")

UNBLOCK_TRIES = 20  # CLIENT UNBLOCKs, 0.1 s apart, while a read is (about to be) blocked


class BlockingReader:
    """`xreadgroup` through a connection of its own (taken from `client`'s pool); `unblock()`
    from any other thread ends a blocked one. A client without a pool (a cluster, a fake)
    reads through `client` itself, and `unblock()` does nothing."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._own: redis.Redis | None = None
        self._id: tuple[Any, int | None] | None = None  # (socket, client id) last asked
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
        if own._sock is None:
            own.connect()
        if self._id is None or self._id[0] is not own._sock:
            try:
                cid: int | None = int(self._own.client_id())
            except redis.ResponseError as exc:  # e.g. an ACL without CLIENT: short blocks
                log.warning("outbox drainer: CLIENT ID refused (%s); reads block briefly", exc)
                cid = None
            self._id = (own._sock, cid)
        return self._own

    @property
    def unblockable(self) -> bool:
        """Whether a long block can be ended by `unblock()` (else the drainer keeps it short)."""
        return self._id is not None and self._id[1] is not None

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
        if self._id is None or self._id[1] is None:
            return False
        cid = self._id[1]
        try:
            for _ in range(UNBLOCK_TRIES):
                if not self._reading.is_set():
                    return False
                if self.client.execute_command("CLIENT", "UNBLOCK", cid):
                    return True
                time.sleep(0.1)
        except redis.RedisError as exc:  # Redis down: the read ends with its own error
            log.debug("outbox drainer: read not unblocked: %s", exc)
        return False

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None
            self._id = None
