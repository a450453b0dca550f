"""utils.redis_pool: LeanPool, redis-py's pool with a lighter checkout keeps its behaviour: one
connection reused, nothing left in use after commands and pipelines, a connection the server
closed replaced at checkout, another process's connection never pooled, and redis-py's own
path wherever its checkout does more (a credential provider, a client-side cache); LeanPacker
puts redis-py's bytes on the wire and refuses what it refuses."""

from __future__ import annotations

import pytest
import redis
from redis.connection import HiredisRespSerializer
from redis.credentials import UsernamePasswordCredentialProvider

from utils.redis import get_redis, reset_clients
from utils.redis_pool import LeanPacker, LeanPool


def test_the_shared_client_takes_the_lean_pool_and_reuses_one_connection(redis_url: str) -> None:
    reset_clients()
    try:
        client = get_redis(redis_url)
        pool = client.connection_pool
        assert isinstance(pool, LeanPool) and pool.lean
        for i in range(5):
            client.set("lean:pool:k", i)
        pipe = client.pipeline()
        pipe.get("lean:pool:k")
        pipe.incr("lean:pool:k")
        assert pipe.execute() == [b"4", 5]
        assert pool._created_connections == 1 and not pool._in_use_connections
        assert len(pool._available_connections) == 1
        client.delete("lean:pool:k")
    finally:
        reset_clients()


def test_a_connection_the_server_closed_is_replaced_at_checkout(redis_url: str) -> None:
    pool = LeanPool.from_url(redis_url)
    client = redis.Redis(connection_pool=pool)
    client.ping()
    assert len(pool._available_connections) == 1
    killer = redis.Redis.from_url(redis_url)
    killer.client_kill_filter(_id=str(client.client_id()))
    killer.close()
    assert client.ping()  # checkout saw the hang-up and reconnected; no error
    assert not pool._in_use_connections and len(pool._available_connections) == 1
    pool.disconnect()


def test_another_process_s_connection_is_not_pooled(redis_url: str) -> None:
    pool = LeanPool.from_url(redis_url)
    conn = pool.get_connection()
    conn.pid = -1  # as if made before a fork
    pool.release(conn)
    assert not pool._available_connections and not pool._in_use_connections
    pool.disconnect()


def test_a_credential_provider_keeps_redis_py_s_own_checkout(redis_url: str) -> None:
    provider = UsernamePasswordCredentialProvider()
    pool = LeanPool.from_url(redis_url, credential_provider=provider)
    assert not pool.lean
    assert redis.Redis(connection_pool=pool).ping()
    assert not pool._in_use_connections
    pool.disconnect()


@pytest.mark.parametrize(
    "args",
    [
        ("SET", "k", "v"),
        (b"SET", b"k", b"v"),
        ("EVALSHA", "a" * 40, 2, "k1", "k2", *[b"x" * 30] * 50, 1.5, 10**30, "é"),
        ("SET", "k", memoryview(b"mv")),
        ("SET", "k", bytearray(b"ba")),  # hiredis refuses it: redis-py's own packing
        ("CONFIG GET", "maxmemory"),  # a name with a space: split, as redis-py does
        (b"CONFIG GET", b"maxmemory"),
        ("GET ", "k"),
    ],
)
def test_the_lean_packer_sends_redis_py_s_bytes(args: tuple) -> None:
    assert LeanPacker().pack(*args) == HiredisRespSerializer().pack(*args)


@pytest.mark.parametrize("bad", [None, True, object()])
def test_the_lean_packer_refuses_what_redis_py_refuses(bad: object) -> None:
    with pytest.raises(redis.DataError):
        HiredisRespSerializer().pack(*("SET", "k", bad))  # type: ignore[arg-type]
    with pytest.raises(redis.DataError):
        LeanPacker().pack("SET", "k", bad)


def test_the_shared_client_packs_with_the_lean_packer(redis_url: str) -> None:
    reset_clients()
    try:
        client = get_redis(redis_url)
        client.set("lean:pack:k", memoryview(b"v1"))
        client.set("lean:pack:b", bytearray(b"v2"))
        assert client.mget("lean:pack:k", "lean:pack:b") == [b"v1", b"v2"]
        (conn,) = client.connection_pool._available_connections
        assert isinstance(conn._command_packer, LeanPacker)
        client.delete("lean:pack:k", "lean:pack:b")
    finally:
        reset_clients()
