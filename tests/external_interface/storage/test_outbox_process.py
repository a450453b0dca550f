"""Drainer processes and real outages: SIGTERM flushes, SIGKILL is recovered, MongoDB restarts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pymongo
import pytest
import redis

from config import ROOT
from external_interface.storage.outbox import Drainer, backlog
from external_interface.storage.sinks.http import HttpSink
from external_interface.storage.sinks.jsonl import JsonlSink, iter_records, read_items
from external_interface.storage.sinks.mongo import MongoSink
from tests.external_interface.mongo_server import MongoServer
from tests.external_interface.sink_servers import RecordingApi
from tests.external_interface.storage.test_outbox import add_posts, counters, wait_until
from utils.servers import RedisServer, free_port

T = "demo.post"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def spawn_drainer(redis_url: str, prefix: str, tmp: Path, **env: str) -> subprocess.Popen[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CHAINCRAWL_")}
    full.update(
        CHAINCRAWL_REDIS_URL=redis_url,
        CHAINCRAWL_KEY_PREFIX=prefix,
        CHAINCRAWL_VAR_DIR=str(tmp / "var"),
        CHAINCRAWL_JSONL_DIR=str(tmp / "items"),
        CHAINCRAWL_JSONL_FSYNC="0",
        CHAINCRAWL_LOG_LEVEL="WARNING",
    )
    full.update(env)
    return subprocess.Popen(
        [sys.executable, "-m", "external_interface.storage.outbox"],
        cwd=ROOT,
        env=full,
        stderr=subprocess.PIPE,
    )


def test_sigterm_flushes_the_last_batch(
    rds: redis.Redis, redis_url: str, key_prefix: str, tmp_path: Path, procs: list
) -> None:
    p = spawn_drainer(
        redis_url, key_prefix, tmp_path, CHAINCRAWL_SINKS="jsonl",
        CHAINCRAWL_OUTBOX_BATCH="1000", CHAINCRAWL_OUTBOX_FLUSH_INTERVAL="60",
        CHAINCRAWL_OUTBOX_IDLE_FLUSH="0",
    )  # fmt: skip
    procs.append(p)
    n = add_posts(rds, key_prefix, 4)
    wait_until(lambda: backlog(rds, key_prefix)["pending"] == 4, 15, "the process to read")
    assert counters(rds, key_prefix, "r1") == {}
    p.send_signal(signal.SIGTERM)
    assert p.wait(15) == 0, p.stderr.read().decode() if p.stderr else ""
    assert counters(rds, key_prefix, "r1") == {"feed:stored": n, "stored": n}
    assert len(read_items(T, tmp_path / "items")) == n
    b = backlog(rds, key_prefix)
    assert (b["length"], b["pending"], b["consumers"]) == (0, 0, {})
    out = subprocess.run(
        [sys.executable, "-m", "external_interface.storage.outbox", "--status"],
        cwd=ROOT, capture_output=True, check=True,
        env={**os.environ, "CHAINCRAWL_REDIS_URL": redis_url, "CHAINCRAWL_KEY_PREFIX": key_prefix},
    )  # fmt: skip
    assert orjson.loads(out.stdout)["length"] == 0


def test_sigkilled_drainer_is_taken_over(
    rds: redis.Redis, redis_url: str, key_prefix: str, tmp_path: Path, procs: list
) -> None:
    with RecordingApi() as api:
        api.down = True
        p = spawn_drainer(redis_url, key_prefix, tmp_path, CHAINCRAWL_SINKS="http",
                          CHAINCRAWL_HTTP_SINK_URL=api.url, CHAINCRAWL_HTTP_SINK_RETRIES="1",
                          CHAINCRAWL_OUTBOX_FLUSH_INTERVAL="0.05")  # fmt: skip
        procs.append(p)
        n = add_posts(rds, key_prefix, 5)
        wait_until(lambda: "http" in backlog(rds, key_prefix)["errors"], 15, "the API error")
        b = backlog(rds, key_prefix)
        assert b["pending"] == 5 and b["length"] == 5 and len(b["consumers"]) == 1
        p.kill()
        p.wait(10)
        api.down = False
        d = Drainer(rds, key_prefix, [HttpSink(api.url)], interval=0.05, claim_idle=0.5)
        d.start_thread()
        try:
            wait_until(lambda: counters(rds, key_prefix, "r1").get("stored") == n, 15, "takeover")
        finally:
            d.stop()
        assert counters(rds, key_prefix, "r1") == {"feed:stored": n, "stored": n}
        assert len(api.items(T)) == n
        assert sum(len(b["items"]) for b in api.bodies) == n  # none was posted twice
        assert backlog(rds, key_prefix)["length"] == 0


def test_mongo_outage_and_restart(rds: redis.Redis, key_prefix: str, tmp_path: Path) -> None:
    server = MongoServer(tmp_path / "nx").start()
    sink = MongoSink(server.url, "outage", timeout=0.5)
    jsonl = JsonlSink(tmp_path / "items", fsync=False, mode="append")
    d = Drainer(
        rds, key_prefix, [jsonl, sink], batch=20, interval=0.05, backoff=0.1, max_backoff=0.5
    )
    d.start_thread()
    try:
        first = add_posts(rds, key_prefix, 3)
        wait_until(
            lambda: counters(rds, key_prefix, "r1").get("stored") == first, 15, "first batch"
        )
        server.stop()  # MongoDB goes down
        more = add_posts(rds, key_prefix, 6, run="r2")
        wait_until(lambda: "mongo" in backlog(rds, key_prefix)["errors"], 15, "the outage")
        b = backlog(rds, key_prefix)
        assert b["length"] == 6 and b["pending"] == 6 and counters(rds, key_prefix, "r2") == {}
        assert "jsonl" not in b["errors"]
        server.start()  # back on the same port and data
        wait_until(lambda: counters(rds, key_prefix, "r2").get("stored") == more, 20, "recovery")
        wait_until(lambda: backlog(rds, key_prefix)["errors"] == {}, 5, "errors cleared")
    finally:
        d.stop()
        sink.close()
        server.stop()
    assert counters(rds, key_prefix, "r1") == {"feed:stored": first, "stored": first}
    assert counters(rds, key_prefix, "r2") == {"feed:stored": more, "stored": more}
    client: pymongo.MongoClient = pymongo.MongoClient(server.url, serverSelectionTimeoutMS=5000)
    server.start()
    try:
        coll = client["outage"]["demo_post"]
        # post ids of r2 overlap r1's (both start at 0): upserted, one document per key
        assert coll.count_documents({}) == 12
        assert coll.count_documents({"_run": "r2"}) == 12  # the later run's entries won
    finally:
        client.close()
        server.stop()
    assert len(list(iter_records(T, tmp_path / "items"))) == first + more  # each entry once


def test_redis_down_at_start_then_up(tmp_path: Path) -> None:
    """A worker may start before Redis: the drainer waits for it instead of dying."""
    port = free_port()
    client = redis.Redis(port=port, socket_connect_timeout=0.5, socket_timeout=5)
    jsonl = JsonlSink(tmp_path / "items", fsync=False, mode="append")
    d = Drainer(client, "cc", [jsonl], interval=0.05, backoff=0.05, max_backoff=0.3)
    d.start_thread()
    try:
        time.sleep(0.5)
        assert d._thread is not None and d._thread.is_alive()
        with RedisServer(tmp_path / "redis", port=port, appendonly=False):
            n = add_posts(client, "cc", 3)
            wait_until(lambda: counters(client, "cc", "r1").get("stored") == n, 15, "stored")
            d.stop()
    finally:
        d.stop()
        client.close()
    assert len(read_items(T, tmp_path / "items")) == n


def outbox_cli(redis_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHAINCRAWL_REDIS_URL": redis_url, "CHAINCRAWL_KEY_PREFIX": prefix,
           "CHAINCRAWL_REDIS_WAIT": "600"}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "external_interface.storage.outbox", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip


def test_status_and_requeue_dead_answer_and_fail_in_one_line(tmp_path: Path) -> None:
    """The operator views answer on a live Redis; with nothing listening (not a restart, so
    no CHAINCRAWL_REDIS_WAIT: 600 s here would hit the timeout) they exit 5 in one line."""
    with RedisServer(tmp_path / "redis", appendonly=False) as server:
        client = redis.Redis.from_url(server.url)
        assert add_posts(client, "cc", 3)
        status = outbox_cli(server.url, "cc", "--status")
        assert status.returncode == 0, status.stderr
        shown = orjson.loads(status.stdout)
        assert shown["length"] == client.xlen(shown["stream"]) > 0, status.stdout
        requeue = outbox_cli(server.url, "cc", "--requeue-dead")
        assert requeue.returncode == 0 and requeue.stdout.strip() == "0", requeue.stderr
        client.close()
    for args in (("--status",), ("--requeue-dead",)):
        out = outbox_cli("redis://:s3cret@127.0.0.1:1/0", "cc", *args)
        assert out.returncode == 5, out.stdout + out.stderr
        assert "Traceback" not in out.stderr and "s3cret" not in out.stderr, out.stderr
        assert out.stderr.splitlines() == [out.stderr.strip()], out.stderr
        assert out.stderr.startswith("error: Redis at 127.0.0.1:1 did not answer"), out.stderr
