"""utils.redis: a patient client (the CLI's) waits out a Redis restart and says so once; a
cluster URL gives a `RedisCluster` that reaches every slot, a plain URL stays a `redis.Redis`; a
socket's client id asked once, and CLIENT UNBLOCK sent again until the command blocks."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from utils import redis as uredis
from utils.redis import (
    cluster_client,
    get_redis,
    is_cluster,
    known_client_id,
    pipeline,
    reset_clients,
    socket_client_id,
    unblock_client,
)
from utils.servers import RedisServer


@pytest.fixture
def patient() -> Iterator[list[Exception | None]]:
    said: list[Exception | None] = []
    uredis.be_patient(30, said.append)
    try:
        yield said
    finally:
        uredis._patience = None
        uredis._outage.notify = None
        uredis._outage.since = None
        uredis._reached = False
        uredis.reset_clients()


def test_a_call_waits_out_a_restart_and_says_so_once(
    tmp_path: Path, patient: list[Exception | None]
) -> None:
    server = RedisServer(tmp_path / "r").start()
    try:
        r = uredis.get_redis(server.url)
        r.set("k", "v")
        server.stop()
        again = threading.Timer(1.5, lambda: RedisServer(tmp_path / "r", server.port).start())
        again.start()
        assert r.get("k") == b"v"  # waited, then read from the restarted server's AOF
        again.join()
        assert len(patient) == 2 and isinstance(patient[0], redis.ConnectionError)
        assert patient[1] is None
    finally:
        redis.Redis(port=server.port).shutdown(nosave=True)


def test_the_wait_ends_with_the_error(tmp_path: Path, patient: list[Exception | None]) -> None:
    uredis.be_patient(1.0, patient.append)
    server = RedisServer(tmp_path / "r").start()
    r = uredis.get_redis(server.url)
    r.ping()
    server.stop()  # gone for good after it answered: waited for, then the error
    with pytest.raises(redis.ConnectionError):
        r.ping()
    assert len(patient) == 1


def test_a_refused_first_connection_is_raised_at_once(patient: list[Exception | None]) -> None:
    """Nothing ever answered there in this process: not a restart, nothing to wait for."""
    r = uredis.get_redis("redis://127.0.0.1:1/0")
    with pytest.raises(redis.ConnectionError, match="refused"):
        r.ping()
    assert patient == []  # no "waiting…" line: the 30 s patience was not spent


def test_a_wrong_password_is_raised_at_once(
    tmp_path: Path, patient: list[Exception | None]
) -> None:
    with RedisServer(tmp_path / "r", password="right") as server:
        uredis.get_redis(server.url).ping()  # reached once: a refusal now would be waited on
        r = uredis.get_redis(f"redis://:wrong@127.0.0.1:{server.port}/0")
        with pytest.raises(redis.AuthenticationError):
            r.ping()
        assert patient == []


def test_a_plain_url_is_one_node(redis_url) -> None:
    client = get_redis(redis_url)
    assert type(client) is redis.Redis and not is_cluster(client)
    assert pipeline(client).transaction


def test_a_cluster_url_names_its_nodes_and_credentials() -> None:
    with pytest.raises(ValueError, match="host:port expected"):
        cluster_client("redis+cluster://127.0.0.1")
    with pytest.raises(RedisClusterException):  # nothing listens there: it tried every node
        cluster_client("redis+cluster://u:p%40ss@127.0.0.1:1,127.0.0.1:2")


@pytest.mark.integration
def test_a_cluster_url_reaches_every_slot(redis_cluster) -> None:
    reset_clients()
    client = get_redis(redis_cluster.url)
    assert isinstance(client, RedisCluster) and is_cluster(client)
    assert get_redis(redis_cluster.url) is client
    for i in range(200):
        client.set(f"tc:k{i}", i)
    assert [int(v) for v in client.mget_nonatomic([f"tc:k{i}" for i in range(200)])] == list(
        range(200)
    )
    pipe = pipeline(client)
    for i in range(200):
        pipe.incr(f"tc:k{i}")
    assert pipe.execute() == [i + 1 for i in range(200)]
    keys_per_master = [n.client().dbsize() for n in redis_cluster.masters()]
    assert all(k > 0 for k in keys_per_master)  # spread over the three masters
    client.delete(*[f"tc:k{i}" for i in range(200)])  # a DEL across slots, split per slot
    reset_clients()


@pytest.mark.integration
def test_stream_reads_and_script_calls_are_routed_without_asking_a_node_for_their_keys(
    redis_cluster, key_prefix
) -> None:
    """redis-py asks its default node (the master of slot 0) the keys of each such command
    in a pipeline: a round trip each, and while that master's range is lost every pipeline
    holding one fails, whatever its slots."""
    client = cluster_client(redis_cluster.url)
    streams = [f"{key_prefix}:{{s{i}}}:outbox" for i in range(6)]  # slots over every master
    for s in streams:
        client.xadd(s, {"n": s})
        client.xgroup_create(s, "g", id="0")
    sha = client.script_load("return KEYS[1]")
    masters = [n.client() for n in redis_cluster.masters()]
    for m in masters:
        m.config_resetstat()
    pipe = client.pipeline(transaction=False)
    for s in streams:
        pipe.xreadgroup("g", "c", {s: ">"}, count=10)
        pipe.execute_command("EVALSHA", sha, 1, s)
    got = pipe.execute()
    assert [r[0][1][0][1][b"n"].decode() for r in got[::2]] == streams  # each from its master
    assert [r.decode() for r in got[1::2]] == streams
    assert (
        cast("list[list[Any]]", client.xread({streams[0]: "0"}, count=1))[0][0]
        == streams[0].encode()
    )
    asked = sum(int(m.info("commandstats").get("cmdstat_command", {}).get("calls", 0))
                for m in masters)  # fmt: skip
    assert asked == 0  # redis-py alone sends COMMAND GETKEYS for each of these
    assert client.commands_parser.get_keys(None, "XREADGROUP", "GROUP", "g", "c", "STREAMS",
                                           "a", "b", ">", ">") == ["a", "b"]  # fmt: skip
    assert client.commands_parser.get_keys(None, "EVALSHA", sha, 2, "a", "b", "x") == ["a", "b"]
    client.delete(*streams)
    client.close()


class _Unblocks:
    """A client whose CLIENT UNBLOCK answers from a script: 0 (nothing blocked yet) or 1."""

    def __init__(self, answers: list[int]) -> None:
        self.answers, self.sent = answers, 0

    def execute_command(self, *args: Any) -> int:
        assert args[:2] == ("CLIENT", "UNBLOCK")
        self.sent += 1
        return self.answers.pop(0) if self.answers else 0


def test_unblock_client_sends_again_while_the_command_has_not_returned() -> None:
    """The command sent an instant ago blocks only after the first UNBLOCK: sent again; a
    command that returned on its own ends the tries; past `tries` it gives up."""
    client = _Unblocks([0, 0, 1])
    assert unblock_client(client, 7, lambda wait: True) is True
    assert client.sent == 3
    client = _Unblocks([])
    assert unblock_client(client, 7, lambda wait: False) is False
    assert client.sent == 1  # the command had returned: nothing to unblock
    client = _Unblocks([])
    assert unblock_client(client, 7, lambda wait: True, tries=4) is False
    assert client.sent == 4


def test_a_sockets_client_id_is_asked_once_and_again_after_a_reconnect(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, single_connection_client=True)
    try:
        conn = client.connection
        assert conn is not None
        assert known_client_id(conn) is None  # never asked
        cid = socket_client_id(conn)
        assert cid == client.client_id()
        assert socket_client_id(conn) == cid and known_client_id(conn) == cid
        conn.disconnect()
        assert known_client_id(conn) is None  # the socket is gone
        again = socket_client_id(conn)  # reconnects and asks the new socket
        assert again is not None and again != cid
    finally:
        client.close()
