"""`utils.servers`: free ports below the ephemeral range, and the test servers: a Redis
Cluster of real redis-servers, formed, used and always stopped."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis

from utils.servers import RedisClusterServer, RedisServer, free_port, wait_aof_written

pytestmark = pytest.mark.integration


def test_a_free_port_is_below_the_ephemeral_range_and_given_once() -> None:
    """No outgoing connection takes it as its source port before its server binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert all(1024 <= p < low for p in ports)
    assert len(set(ports)) == len(ports)


def test_a_cluster_has_its_masters_and_replicas_and_covers_every_slot(tmp_path) -> None:
    server = RedisClusterServer(tmp_path, masters=3, replicas=1)
    with server:
        assert len(server.nodes) == 6
        assert len(server.masters()) == 3
        client = server.nodes[0].client()
        slots = client.execute_command("CLUSTER", "SLOTS")
        covered = sum(int(end) - int(start) + 1 for start, end, *_ in slots)
        assert covered == RedisClusterServer.SLOTS
        assert all(len(entry[2:]) == 2 for entry in slots)  # a master and its replica
        assert server.url.startswith("redis+cluster://127.0.0.1:")
        assert all(n.port <= 55535 for n in server.nodes)  # the bus port is port + 10000
    assert not any(_listening(n.port) for n in server.nodes)


def test_a_cluster_that_cannot_form_is_stopped(tmp_path, monkeypatch) -> None:
    server = RedisClusterServer(tmp_path, masters=3, replicas=0)

    def refuse(*a, **kw):
        raise redis.ResponseError("ERR refused")

    monkeypatch.setattr(RedisClusterServer, "_form", refuse)
    with pytest.raises(redis.ResponseError):
        server.start()
    assert all(n.proc is None for n in server.nodes)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_answered_writes_are_in_the_append_only_file_before_a_kill(tmp_path) -> None:
    """After the wait, a SIGKILL loses no answered write; with `pause_writes`, a write sent
    after the wait is not answered before the kill."""
    server = RedisServer(tmp_path / "r").start()
    try:
        r = redis.Redis.from_url(server.url)
        for i in range(200):
            r.set(f"k{i}", "v" * 1000)
        wait_aof_written(r, pause_writes=True)
        late = redis.Redis.from_url(server.url, socket_timeout=1)
        with pytest.raises(redis.TimeoutError):
            late.set("late", "1")  # held by the pause
        server.kill()
        server.start()
        r = redis.Redis.from_url(server.url)
        assert r.dbsize() == 200 and r.get("late") is None
    finally:
        server.stop()
