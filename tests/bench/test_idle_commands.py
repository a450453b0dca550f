"""bench.idle_commands counts the commands a server ran since its stats were reset, the reset
left out (on a server of the test's own: nothing else runs commands on it)."""

from __future__ import annotations

from pathlib import Path

import redis

from bench.idle_commands import commandstats, monitor_line
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


def test_monitor_lines_fold_ids_and_keep_subcommands_and_keys() -> None:
    """One line per kind of key: every owner's heartbeat alike; a subcommand stays with its
    command; a script's first key, a stream read's stream; a payload is left out."""
    assert monitor_line("SET idle:q:owner_alive:idle1@vm:27186:6be6ac 27186 PX 20000") == (
        monitor_line("SET idle:q:owner_alive:idle1@vm:31415:0a1b2c 31415 PX 20000")
    )
    assert monitor_line("SET idle:q:owner_alive:w1@vm:27186:6be6ac 1") == (
        "SET idle:q:owner_alive:w1@vm:<id>:<id>"
    )
    assert monitor_line("CLIENT UNBLOCK 12") == "CLIENT UNBLOCK 12"
    assert monitor_line("XINFO STREAM idle:outbox") == "XINFO STREAM idle:outbox"
    assert monitor_line("EVALSHA 0123abcd 1 idle:sweeper:lock tok 5000") == (
        "EVALSHA idle:sweeper:lock"
    )
    assert monitor_line(
        "XREADGROUP GROUP sinks c1 COUNT 500 BLOCK 10000 STREAMS idle:outbox >"
    ) == ("XREADGROUP idle:outbox")
    assert monitor_line('PUBLISH {"hostname": "w1"}') == "PUBLISH"
    assert monitor_line("") == ""
