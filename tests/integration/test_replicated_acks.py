"""The durability rule on every acknowledgement path (docs/cluster.md, "On a failover"): with
`CHAINCRAWL_REDIS_WAIT_REPLICAS=1` a real worker acknowledges a redelivered task whose commit
is already there ("duplicate") only once a replica confirms it, like a commit; with no replica
reachable nothing is acknowledged (a duplicate, a fresh page, a paused run's park), the
messages are requeued quietly (one warning line, a metric, no traceback) and go through once
a replica is back.

The state store is a master with one replica (`replicaof`), the broker the session's Redis."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import worker
from config import Settings, get_settings, reset_settings
from ledger.state import RunState
from lifecycle.endpoints import get_endpoint
from monitor import status as st
from utils import environ
from utils.redis import get_redis, reset_clients
from utils.servers import RedisServer

pytestmark = pytest.mark.integration

PROBE = "testsite.local.probe"


def _until(cond: Callable[[], Any], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _follow(replica: RedisServer, master: RedisServer) -> None:
    replica.start()
    replica_client = redis.Redis(port=replica.port)
    replica_client.replicaof(master.host, master.port)
    m = redis.Redis(port=master.port)
    _until(lambda: m.info("replication")["connected_slaves"] == 1, "replica attached")
    _until(lambda: replica_client.info("replication")["master_link_status"] == "up", "synced")


@pytest.fixture
def replicated(
    cc_env: dict[str, str], redis_server: RedisServer, tmp_path: Path
) -> Iterator[tuple[dict[str, str], RedisServer, RedisServer]]:
    """A master and its replica as the state store of this process and its workers."""
    master = RedisServer(tmp_path / "master").start()
    replica = RedisServer(tmp_path / "replica")
    try:
        _follow(replica, master)
        env = {"CHAINCRAWL_REDIS_URL": master.url, "CHAINCRAWL_BROKER_URL": redis_server.url,
               "CHAINCRAWL_KEY_PREFIX": f"rep{uuid.uuid4().hex[:6]}",
               "CHAINCRAWL_REDIS_WAIT_REPLICAS": "1", "CHAINCRAWL_REDIS_WAIT_TIMEOUT": "0.3",
               "CHAINCRAWL_METRICS_FLUSH_INTERVAL": "0.2"}  # fmt: skip
        saved = environ.apply(env)
        reset_settings()
        reset_clients()
        worker.configure(get_settings())
        try:
            yield env, master, replica
        finally:
            environ.restore(saved)
            reset_settings()
            reset_clients()
            worker.configure(get_settings())
    finally:
        replica.stop()
        master.stop()


def _metrics() -> dict[str, int]:
    return st.task_metrics(get_redis(), get_settings()).get(PROBE, {})


def _committed_unconfirmed(tid: str) -> None:
    """A task's commit as a worker wrote it before its WAIT: there, replicated or not."""
    s = Settings(**{**get_settings().model_dump(), "redis_wait_replicas": 0})
    state = RunState(get_redis(), s)
    assert state.commit(rid="", tid=tid, step="s", outcome="succeeded") is not None


def _send(tid: str, meta: dict[str, Any] | None = None) -> None:
    params = {"entry_id": "e1", "path": "/flaky/rep?fails=0"}
    get_endpoint(PROBE).task.apply_async(args=(params, meta or {}), task_id=tid,
                                         queue="testsite")  # fmt: skip


def test_a_duplicate_is_acknowledged_only_once_a_replica_confirms(
    replicated: tuple[dict[str, str], RedisServer, RedisServer], start_worker: Any
) -> None:
    env, master, replica = replicated
    w = start_worker(pool="threads", concurrency=2, name="rep", **env)
    state = RunState(get_redis(), get_settings())
    first = uuid.uuid4().hex
    _committed_unconfirmed(first)
    _send(first)
    _until(lambda: _metrics().get("duplicate", 0) == 1, "the duplicate acknowledged")
    # it was acknowledged after a WAIT: the marker write WAIT covers is on its slot's master
    assert master_client(master).exists(f"{state.home_key('', first)}:replicated")

    rid = uuid.uuid4().hex[:16]  # a paused run: its task is parked, not fetched
    state.create_run(rid, "c", b"{}", 5)
    state.add_dispatched(rid, "local.probe", 1)
    assert state.pause(rid).was == "running"

    replica.stop()  # no replica reachable: WAIT 1 confirms nothing
    _until(lambda: master_client(master).info("replication")["connected_slaves"] == 0, "gone")
    dup, fresh = uuid.uuid4().hex, uuid.uuid4().hex
    _committed_unconfirmed(dup)
    _send(dup)  # a redelivery of a commit no replica holds
    _send(fresh)  # a page whose own commit no replica confirms
    parked = uuid.uuid4().hex
    _send(parked, {"run": rid, "step": "local.probe"})  # a park no replica confirms
    _until(lambda: _metrics().get("unreplicated", 0) >= 9, "requeued and redelivered")
    m = _metrics()
    assert m.get("duplicate", 0) == 1 and m.get("paused", 0) == 0, m  # none acknowledged
    text = w.log.read_text()
    assert "Traceback" not in text, text[-3000:]
    refusals = [line for line in text.splitlines() if "not confirmed by 1 replica" in line]
    assert len(refusals) == 1, refusals
    assert "Reject" not in text

    _follow(replica, master)  # a replica back: both go through, acknowledged

    # each acknowledged once, counted once: the first duplicate, the second, the fresh page
    # (a duplicate now: its commit landed before its WAIT was refused) and the parked task
    # (`paused`, or `duplicate` if a redelivery found it parked)
    def acked() -> int:
        m = _metrics()
        return m.get("duplicate", 0) + m.get("paused", 0)

    _until(lambda: acked() == 4, "all acknowledged at last")
    assert _metrics().get("duplicate", 0) >= 3, _metrics()
    assert state.begin("", fresh, 0).committed
    assert state.waiting(rid) == 1  # parked once
    _until(lambda: "replicas confirm writes again" in w.log.read_text(), "recovery said")
    text = w.log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert len([ln for ln in text.splitlines() if "not confirmed by 1 replica" in ln]) == 1


def master_client(master: RedisServer) -> redis.Redis:
    return redis.Redis(port=master.port)
