"""One Redis client per process and URL, safe across fork (prefork children reconnect)."""

from __future__ import annotations

import os
import threading

import redis

from config import get_settings

_lock = threading.Lock()
_clients: dict[tuple[str, int], redis.Redis] = {}


def get_redis(url: str | None = None) -> redis.Redis:
    """A shared, thread-safe client (redis-py pools connections per client).

    Keyed by pid so a forked child never reuses its parent's sockets.
    """
    url = url or get_settings().redis_url
    key = (url, os.getpid())
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = redis.Redis.from_url(
                    url,
                    socket_connect_timeout=5,
                    socket_timeout=30,
                    health_check_interval=30,
                    retry_on_timeout=True,
                )
                _clients[key] = client
    return client


def reset_clients() -> None:
    """Drop cached clients (tests that switch servers call this)."""
    with _lock:
        _clients.clear()
