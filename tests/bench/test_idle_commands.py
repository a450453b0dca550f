"""bench.idle_commands counts the commands a server ran since its stats were reset, the reset
left out (on a server of the test's own: nothing else runs commands on it)."""

from __future__ import annotations

from pathlib import Path

import redis

from bench.idle_commands import commandstats
from utils.servers import RedisServer


def test_commandstats_counts_what_ran_since_the_reset(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis", appendonly=False) as server:
        client = redis.Redis.from_url(server.url)
        client.config_resetstat()
        for i in range(3):
            client.set(f"k{i}", i)
        client.get("k0")
        got = commandstats(client)
        client.close()
    assert got == {"set": 3, "get": 1}
