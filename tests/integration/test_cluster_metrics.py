"""The metrics flush on a cluster with a slot range lost: a cluster pipeline sends each
hash's script call to its own master. Were the sums of the masters that answer written while
the pipeline as a whole failed on the lost one, keeping them all for the next try and writing
the served ones again (`Aggregator._flush_served`) would add them twice, every flush while the
range is lost. They are not: the served sums are written once and the lost range's kept
until it is served (checked against redis-py's cluster pipeline as it behaves). Nor does a
commit whose pipeline failed on another master after its script committed keep the sums the
masters that answered took."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import redis

import lifecycle.commits
from config import Settings
from ledger.publish import Load
from ledger.state import RunState
from lifecycle.commits import send_commits
from monitor.metrics import Aggregator
from tests.conditions import wait_for
from utils.redis import cluster_client
from utils.servers import RedisClusterServer
from utils.slots import lost_ranges

pytestmark = pytest.mark.integration


def test_a_flush_while_a_range_is_lost_adds_the_served_sums_once(
    tmp_path: Path, key_prefix: str
) -> None:
    with RedisClusterServer(tmp_path / "cluster", node_timeout_ms=1000,
                            full_coverage=False) as cluster:  # fmt: skip
        client = cluster_client(cluster.url)
        lost = int(client.get_default_node().port)

        def port(key: str) -> int:
            return int(client.get_node_from_key(key).port)

        keys = [f"{key_prefix}:metrics:task:t{i}" for i in range(30)]
        served = [k for k in keys if port(k) != lost]
        on_lost = [k for k in keys if port(k) == lost]
        assert served and on_lost
        nodes = [n for n in cluster.nodes  # the master and its replica
                 if n.port == lost or n.client().info("replication").get("master_port") == lost]  # fmt: skip
        for n in nodes:
            n.kill()
        wait_for(lambda: lost_ranges(client, fresh=True), 60, "the range seen lost")
        agg = Aggregator()
        for k in keys:
            agg.add((k,), {"succeeded": 1})
        agg.flush(client)  # the lost range's sums are kept, the others written
        for k in served:
            assert client.hget(k, "succeeded") == b"1", k
        assert agg.pending()
        agg.flush(client)  # again: still nothing added twice
        for k in served:
            assert client.hget(k, "succeeded") == b"1", k
        for n in nodes:
            n.start()
        cluster.wait_ok(60)
        wait_for(lambda: not lost_ranges(client, fresh=True), 60, "the range served again")
        agg.flush(client)  # the kept sums, once
        for k in keys:
            assert client.hget(k, "succeeded") == b"1", k
        assert not agg.pending()


def test_a_commit_whose_pipeline_fails_on_another_master_adds_each_sum_once(
    redis_cluster: RedisClusterServer, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit script succeeds on its master, the metrics calls of another fail (out of
    memory there): the commit raises (the message is requeued, its redelivery finds the
    task committed), the sums the other masters took are written once, the failed ones are
    written by the next flush, once."""
    client = cluster_client(redis_cluster.url)
    s = Settings(redis_url=redis_cluster.url, broker_url="redis://127.0.0.1:1/0",
                 key_prefix=key_prefix)  # fmt: skip
    state = RunState(cast(redis.Redis, client), s)
    call = state.commit_call(rid="", tid=uuid.uuid4().hex, step="s", outcome="succeeded")

    def port(key: str) -> int:
        return int(client.get_node_from_key(key).port)

    keys = [f"{key_prefix}:metrics:task:t{i}" for i in range(30)]
    full = next(k for k in keys if port(k) != port(call.done_key))
    assert any(port(k) != port(full) for k in keys)
    agg = Aggregator()
    monkeypatch.setattr(lifecycle.commits, "aggregator", lambda: agg)
    for k in keys:
        agg.add((k,), {"succeeded": 1})
    rt: Any = SimpleNamespace(load=Load(slots=16), outstanding_seen=lambda rid: None,
                              note_outstanding=lambda rid, n: None,
                              note_hold=lambda rid, hold: None)  # fmt: skip
    master = client.get_redis_connection(client.get_node_from_key(full))
    master.config_set("maxmemory", 1)  # refuses the scripts that write: OOM
    try:
        with pytest.raises(redis.exceptions.ResponseError, match="OOM"):
            send_commits(rt, state, "", [call])
    finally:
        master.config_set("maxmemory", 0)
    assert state.run_commits([call]) == [None]  # the script had committed it
    for k in keys:
        assert client.hget(k, "succeeded") == (None if port(k) == port(full) else b"1"), k
    agg.flush(client)
    for k in keys:
        assert client.hget(k, "succeeded") == b"1", k
    assert not agg.pending()
