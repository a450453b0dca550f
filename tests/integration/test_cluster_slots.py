"""A lost slot range becomes a pause (docs/cluster.md, "A lost slot range"): on a 3+3 cluster
with `cluster-require-full-coverage no`, a master and its replica SIGKILLed mid-crawl under
real workers; the run on their slots is shown paused by the real CLI (`runs`, `status`) with
a reason naming the slots and both nodes, the `trigger` watching it exits 6 saying so, the runs on the other masters finish (their items stored, their triggers exit 0), the workers
say it once with no traceback however long the loss (no line from their other parts), and once the two nodes are started again the paused run
resumes by itself and finishes with exact counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from chains.broker_scan import message_ids
from config import ROOT, Settings
from ledger.state import RunState
from lifecycle.lost import park_seconds
from tests.conditions import wait_for
from utils.keyspace import Keyspace
from utils.redis import cluster_client
from utils.servers import ClusterNodeServer, RedisClusterServer, RedisServer, wait_aof_written
from utils.slots import lost_ranges

pytestmark = pytest.mark.integration

PAGES = 30
RUNS = 3
LONG_LOSS = 45.0  # seconds the range stays lost: several rounds of every part's retries


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT,
                          env={**os.environ, **env, "COLUMNS": "200"}, capture_output=True,
                          text=True, timeout=180)  # fmt: skip


def _trigger(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """`trigger` watching its run, its first line (the run id) readable at once."""
    return subprocess.Popen([sys.executable, "-m", "cli", "trigger", *args], cwd=ROOT,
                            env={**os.environ, **env, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _replica_of(cluster: RedisClusterServer, master: ClusterNodeServer) -> ClusterNodeServer:
    for n in cluster.nodes:
        info = n.client().info("replication")
        if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
            return n
    raise AssertionError(f"no replica of {master.port}")


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """The commands a test left running, ended with it (a failed assertion included)."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate()


def test_a_lost_slot_range_pauses_its_runs_and_they_resume_when_it_returns(
    tmp_path: Path,
    redis_server: RedisServer,
    start_worker: Any,
    started: list[subprocess.Popen[str]],
) -> None:
    with RedisClusterServer(tmp_path / "cluster", node_timeout_ms=1000,
                            full_coverage=False) as cluster:  # fmt: skip
        client = cluster_client(cluster.url)

        def listing_ports(ks: Keyspace) -> set[int]:  # the keys the run lists are read from
            keys = (ks.active_runs, ks.recent_runs, ks.storing_runs)
            return {client.get_node_from_key(k).port for k in keys}

        # the victim's master is the master of slot 0, redis-py's default node (every process
        # asked it the keys of each script call in a pipeline: the drainer's acknowledgements
        # of every run failed while it was lost), and it holds the drainer's sink-errors key
        # (written beside them); a prefix whose run-list keys are elsewhere (a run list on the
        # lost range cannot be read: docs/cluster.md)
        slot0 = int(client.get_default_node().port)
        prefix = next(p for p in (f"cls{uuid.uuid4().hex[:6]}" for _ in range(1000))
                      if slot0 not in listing_ports(Keyspace(p))
                      and client.get_node_from_key(Keyspace(p).outbox_errors).port == slot0
                      and client.get_node_from_key(Keyspace(p).recrawl_watches).port == slot0)  # fmt: skip
        env = {"CHAINCRAWL_REDIS_URL": cluster.url, "CHAINCRAWL_BROKER_URL": redis_server.url,
               "CHAINCRAWL_KEY_PREFIX": prefix,
               "CHAINCRAWL_EXTRA_CHAIN_PACKAGES": "tests.cli.clichains",
               "CHAINCRAWL_JSONL_DIR": str(tmp_path / "items"), "CHAINCRAWL_REDIS_WAIT": "60",
               "CHAINCRAWL_RUN_MAX_IN_FLIGHT": "2",
               # a delivery that meets the dead master before the range is flagged lost spends
               # up to ~8 s in redis-py's retries: under the conftest's 6 s timeout kombu gave
               # it back meanwhile (a copy of its own); 12 s still cuts the park's countdown
               # (6 s, not PARK_SECONDS: lifecycle/lost.py park_seconds)
               "CHAINCRAWL_VISIBILITY_TIMEOUT": "12"}  # fmt: skip
        # two worker processes: a parked task's copies must not multiply across processes
        # either (each process's surplus guard sees only its own parks: lifecycle/lost.py)
        workers = [start_worker(concurrency=2, **env), start_worker(concurrency=2, **env)]
        s = Settings(redis_url=cluster.url, broker_url=redis_server.url, key_prefix=prefix,
                     visibility_timeout=12)  # fmt: skip
        state = RunState(cast(redis.Redis, client), s)
        ks = Keyspace(prefix)
        rids, triggers = [], {}
        # placed one a master, each watched by its `trigger`; at most 2 tasks of a run in the
        # broker at once, so the runs are crawled side by side (one after another, the runs
        # queued before the victim would be done before it is lost, with nothing left to test)
        # and each lasts (PAGES x 2 s / 2) longer than the triggers take on a busy machine
        for r in range(RUNS):
            seeds = json.dumps([{"path": f"/flaky/r{r}-{i}?fails=0&delay=2"}
                                for i in range(PAGES)])  # fmt: skip
            proc = _trigger(env, "cli_probe", seeds)
            started.append(proc)
            assert proc.stdout is not None
            first = proc.stdout.readline()  # "run id: RID  chain: cli_probe", then it watches
            assert "run id:" in first, first + (proc.stderr.read() if proc.stderr else "")
            rids.append(first.split("run id:")[1].split()[0])
            triggers[rids[-1]] = proc
        port = {rid: client.get_node_from_key(ks.run(rid)).port for rid in rids}
        assert len(set(port.values())) == RUNS, port
        lost_rid = next(rid for rid in rids if port[rid] == slot0)  # the victim
        others = [rid for rid in rids if rid != lost_rid]
        master = cluster.node_for_port(port[lost_rid])
        replica = _replica_of(cluster, master)
        wait_for(lambda: state.counters(lost_rid).get("succeeded", 0) >= 3, 120, "mid-crawl")
        # the writes answered so far in both append-only files, no more answered until the
        # kill: the run is to come back with exact counts, and with `appendfsync everysec` a
        # busy disk has Redis hold answered writes in memory for up to 2 s
        with master.client() as c:
            wait_aof_written(c, pause_writes=True)
        with replica.client() as c:
            wait_aof_written(c)
        master.kill()
        replica.kill()
        killed = time.monotonic()
        ranges = wait_for(lambda: lost_ranges(client, fresh=True), 60, "the range seen lost")
        where, rep = f"{master.host}:{master.port}", f"{replica.host}:{replica.port}"
        assert [r.master for r in ranges] == [where], ranges
        slots = ranges[0].slots
        reason = f"slots {slots} lost: {where} and its replica {rep} do not answer"

        def runs_json() -> dict[str, dict[str, Any]]:
            out = _cli(env, "runs", "--json")
            assert out.returncode == 0, out.stdout + out.stderr
            return {r["run_id"]: r for r in json.loads(out.stdout)}

        shown = wait_for(lambda: (r := runs_json()).get(lost_rid, {}).get("reason") and r,
                         60, "the lost run shown paused")  # fmt: skip
        assert shown[lost_rid]["status"] == "paused", shown[lost_rid]
        assert shown[lost_rid]["reason"] == reason, shown[lost_rid]
        one = _cli(env, "runs", lost_rid)
        assert one.returncode == 0 and f"paused: {reason}" in one.stdout, one.stdout + one.stderr
        status = _cli(env, "status", "--json", "--no-workers")
        assert status.returncode == 0, status.stdout + status.stderr
        snap = json.loads(status.stdout)
        assert snap["lost_slots"] == reason, snap["lost_slots"]
        paused = {r["run_id"]: r for r in snap["active_runs"]}
        assert paused[lost_rid]["reason"] == reason, paused

        # the trigger watching the lost run says so, naming the slots and nodes, and exits 6
        # (neither success nor a Redis that does not answer: docs/cli.md)
        said, err = triggers[lost_rid].communicate(timeout=180)
        assert triggers[lost_rid].returncode == 6, said + err
        assert f"run {lost_rid} is paused: {reason}; it resumes by itself" in err, said + err
        assert "Traceback" not in err, err

        # the runs on the other masters go on and finish
        def finished(rid: str) -> bool:
            c = state.counters(rid)
            return c.get("succeeded", 0) == PAGES and c.get("outstanding", 1) == 0

        wait_for(lambda: all(finished(r) for r in others), 180, "the other runs finished")
        for rid in others:  # their triggers watched them to the end
            said, err = triggers[rid].communicate(timeout=180)
            assert triggers[rid].returncode == 0, said + err
            assert f"run {rid} complete: every task succeeded" in said, said + err
        # a long loss: the drainer, sweeper and heartbeat meet the lost master again and again
        # (every few seconds) between successes on the others; none of it is a line of its own
        time.sleep(max(0.0, LONG_LOSS - (time.monotonic() - killed)))
        still = runs_json()[lost_rid]  # its keys do not answer: it is still shown paused
        assert (still["status"], still["reason"]) == ("paused", reason), still
        logs = [w.text() for w in workers]
        # one line from the tasks that park (each worker process that parks one), at most one
        # from the drainer holding back the lost run's entries (and from a re-crawl watch
        # whose keys are lost)
        lines = [log.count(f"{reason}; the runs on those slots are paused") for log in logs]
        assert sum(lines) >= 1 and max(lines) == 1, (lines, [log[-4000:] for log in logs])
        for log in logs:
            assert log.count(f"outbox drainer: {reason}") <= 1, log[-4000:]
        # the lost run's messages parked about once a countdown each, not multiplied: the
        # countdown under the visibility timeout (12 s here), or kombu gave each waiting
        # message back while its worker held it and both parked again (148 parks in 93 s)
        lost_for, wait = time.monotonic() - killed, park_seconds(s)
        parked = int(client.hget(ks.key("metrics", "cluster"), "parked_lost") or 0)
        print(f"parked {parked} in {lost_for:.0f}s, a {wait:g}s countdown")
        # the lost run's 2 tasks in flight park once a countdown each; other runs' messages
        # whose commits met the lost nodes (their metrics sums there) park at most as often
        assert parked <= 3 * 2 * (lost_for / wait + 1), parked
        # and the broker holds one copy of each parked task, not a copy a park (1,250 of each
        # of the lost run's two tasks were seen waiting in a worker)
        broker, copies = redis.Redis.from_url(redis_server.url), Counter[str]()
        for key in broker.scan_iter(match=f"{s.broker_key_prefix}*", _type="list"):
            for raw in broker.lrange(key, 0, -1):
                copies.update(message_ids(raw))
        for _tag, raw in broker.hscan_iter(f"{s.broker_key_prefix}unacked"):
            copies.update(message_ids(raw))
        print(f"most copies of a task in the broker: {copies.most_common(3)}")
        assert max(copies.values(), default=0) <= 2, copies.most_common(3)
        for log in logs:
            assert "Traceback" not in log, log[-4000:]
            # from the lost range's line on, however long the loss, nothing more about Redis
            # (the lines before it, while the cluster had not flagged the range, may look
            # like a failover)
            after = log.split(f"{slots} lost: {where}", 1)[1:]
            assert not after or ("Redis does not answer" not in after[0]
                                 and "answers again" not in after[0]), after  # fmt: skip

        master.start()  # both back: the range is served again, the paused run resumes itself
        replica.start()
        cluster.wait_ok(60)
        wait_for(lambda: not lost_ranges(client, fresh=True), 60, "the range served again")
        try:
            wait_for(lambda: finished(lost_rid), 180, "the paused run finished")
        except TimeoutError:
            raise AssertionError(
                (state.counters(lost_rid), [w.text()[-6000:] for w in workers])
            ) from None
        for rid in rids:
            c = state.counters(rid)
            got = [c.get(k, 0) for k in ("dispatched", "succeeded", "failed", "outstanding")]
            assert got == [PAGES, PAGES, 0, 0], (rid, c)
            assert c["items"] == PAGES, (rid, c)
        wait_for(lambda: all(state.counters(r).get("stored", 0) == PAGES for r in rids), 120,
                 "every item stored")  # fmt: skip
        out = _cli(env, "runs", "--json")
        assert {r["run_id"]: r["status"] for r in json.loads(out.stdout)
                if r["run_id"] in rids} == dict.fromkeys(rids, "done"), out.stdout  # fmt: skip
        logs = [w.text() for w in workers]
        assert any("lost slots served again" in log for log in logs), [g[-4000:] for g in logs]
        for log in logs:
            assert "Traceback" not in log, log[-4000:]
