"""The embedded Redis `control.sh` starts (cli.procs.ensure_redis) is private: the generated
password from var/redis.secret, refused without it, off its command line, files 0600 in a 0700
dir; one already running without that password is named, not met with a traceback."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import redis

from cli import UserError, procs
from config import Settings
from utils.servers import RedisServer, free_port


def test_ensure_redis_starts_it_with_the_generated_password(tmp_path: Path) -> None:
    s = Settings(var_dir=tmp_path / "var", redis_url="", embedded_redis_port=free_port())
    (tmp_path / "var" / "redis").mkdir(parents=True)
    (tmp_path / "var" / "redis" / "appendonly.aof").write_bytes(b"")  # left readable before
    (tmp_path / "var" / "redis" / "appendonly.aof").chmod(0o644)
    try:
        assert procs.ensure_redis(s) == "started"
        password = (tmp_path / "var" / "redis.secret").read_text().strip()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=s.embedded_redis_port).ping()
        r = redis.Redis.from_url(s.redis_url)
        r.set("k", "v")
        r.save()
        pid = (tmp_path / "var" / "redis" / "redis.pid").read_text().strip()
        assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        data = tmp_path / "var" / "redis"
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in data.iterdir()}
        assert {"appendonly.aof", "dump.rdb", "redis.log", "redis.pid"} <= set(modes)
        assert set(modes.values()) == {0o600}, modes
        assert procs.ensure_redis(s) == "running"
    finally:
        procs.stop_redis(s)


def test_an_embedded_redis_running_without_the_password_is_named(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "old") as old:  # started before passwords, say
        s = Settings(var_dir=tmp_path / "var", redis_url="", embedded_redis_port=old.port)
        with pytest.raises(UserError, match=r"does not want the password in .*redis\.secret"):
            procs.ensure_redis(s)
    with RedisServer(tmp_path / "other", password="another") as other:  # another var/'s
        s = Settings(var_dir=tmp_path / "var", redis_url="", embedded_redis_port=other.port)
        with pytest.raises(UserError, match=r"does not want the password.*redis stop"):
            procs.ensure_redis(s)


def test_a_cluster_state_store_is_checked_not_started(tmp_path: Path, redis_cluster) -> None:
    """A `redis+cluster://` REDIS_URL is never the embedded Redis: control.sh checks that the
    cluster answers and names it when it does not."""
    broker = "redis://127.0.0.1:1/0"
    s = Settings(var_dir=tmp_path / "var", redis_url=redis_cluster.url, broker_url=broker)
    assert not procs.uses_embedded_redis(s)
    assert procs.redis_hostport(s) == ("127.0.0.1", redis_cluster.nodes[0].port)
    assert procs.ensure_redis(s) == "running"
    gone = f"redis+cluster://127.0.0.1:{free_port()}"
    with pytest.raises(UserError, match=r"^the Redis Cluster of REDIS_URL is not reachable"):
        procs.ensure_redis(Settings(var_dir=tmp_path / "var", redis_url=gone, broker_url=broker))


def test_the_password_check_connects_once_per_probe(tmp_path: Path) -> None:
    """A Redis refusing a client without a password answers once and for all: redis-py's
    retries of that refusal (an AuthenticationError is a ConnectionError to it) were seconds
    of back-off on every command that checks the embedded Redis."""
    with RedisServer(tmp_path / "r", password="pw") as server:
        s = Settings(
            var_dir=tmp_path / "var", redis_url=server.url, embedded_redis_port=server.port
        )
        counter = redis.Redis.from_url(server.url)

        def received() -> int:
            return int(counter.info("stats")["total_connections_received"])

        before = received()
        assert procs._wants_our_password(s, "127.0.0.1", server.port)
        assert received() - before == 2  # the probe without the password, the one with it
