"""The shared clients' connection pool and command packer, lighter than redis-py 8's own
per command where the work they leave out does nothing (`utils.redis.get_redis` builds its
clients with both; a cluster client and kombu's broker channels keep redis-py's)."""

from __future__ import annotations

from typing import Any

import redis
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

if HIREDIS_AVAILABLE:
    import hiredis


def lean_kwargs() -> dict[str, Any]:
    """The connection options of a lean client: the packer where hiredis packs commands."""
    return {"command_packer": LeanPacker()} if HIREDIS_AVAILABLE else {}


class LeanPacker(HiredisRespSerializer):
    """redis-py's hiredis packer without its per-argument pass: redis-py turns every
    bytearray and memoryview argument into bytes in a Python generator before hiredis packs
    the command, a Python step per argument (a batch's commit script and outbox entries
    carry hundreds). Here hiredis packs the arguments as they are (it takes str, int,
    float, bytes and memoryview, each as redis-py's pass would give it), and a command it
    refuses (a bytearray, a wrong type) or whose name holds a space ("CONFIG GET") goes to
    redis-py's own packing: the same bytes on the wire, the same DataError."""

    def pack(self, *args: Any) -> list[bytes]:
        head = args[0]
        if isinstance(head, str):
            if head.split() != [head]:  # redis-py splits the name on whitespace
                return super().pack(*args)
        elif not isinstance(head, bytes) or b" " in head:
            return super().pack(*args)
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            return super().pack(*args)


class LeanPool(redis.ConnectionPool):
    """redis-py's connection pool with a lighter checkout: every command (and pipeline)
    takes a connection and gives it back, and redis-py 8 does it with four calls to its
    metrics recorder, a pool-name lookup, a deprecation wrapper and an event dispatch around
    each, about 9 us a command on a gevent worker. Here the same steps without them, where
    they do nothing: redis-py's OpenTelemetry metrics off in this process when the pool is
    built, no client-side cache, no streaming credential provider (whose re-auth the
    release event triggers). The steps kept are redis-py's own: the pid check (a forked
    child never uses its parent's sockets), the lock, the connection made or reused,
    connected, checked for unread bytes or a closed socket (reconnected then), and given
    back unless another process owns it or it was marked for reconnect. Any other pool
    (metrics on, a cache, a credential provider) takes redis-py's own path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            from redis.observability.recorder import _get_or_create_collector

            metrics = _get_or_create_collector() is not None
        except ImportError:  # a redis-py whose internals moved: its own path throughout
            metrics = True
        self.lean = (
            not metrics
            and self.cache is None
            and self.connection_kwargs.get("credential_provider") is None
        )

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if not self.lean or args or kwargs:
            return super().get_connection(*args, **kwargs)
        self._checkpid()
        with self._lock:
            try:
                connection = self._available_connections.pop()
            except IndexError:
                connection = self.make_connection()
            self._in_use_connections.add(connection)
        try:
            connection.connect()
            try:
                if connection.can_read() and not self.maint_notifications_enabled():
                    raise redis.ConnectionError("Connection has data")
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                connection.disconnect()
                connection.connect()
                if connection.can_read() and not self.maint_notifications_enabled():
                    raise redis.ConnectionError("Connection not ready") from None
        except BaseException:
            self.release(connection)
            raise
        return connection

    def release(self, connection: Any) -> None:
        if not self.lean or not self.owns_connection(connection):
            return super().release(connection)
        self._checkpid()
        with self._lock:
            try:
                self._in_use_connections.remove(connection)
            except KeyError:  # not this pool's (reset meanwhile): dropped, as redis-py does
                return
            if connection.should_reconnect():
                connection.disconnect()
            self._available_connections.append(connection)
