"""The run ledger's Redis cost per page on one Redis against a Redis Cluster, and each
master's share; the dedup store's bytes per record spread over the masters.

    .venv/bin/python -m bench.cluster_bench                     # 10,000 pages, 12 runs
    .venv/bin/python -m bench.cluster_bench --pages 2000 --runs 4 --dedup 0

Starts its own servers (never the shared Redis): one redis-server, then a cluster of three
masters with a replica each (`utils.servers.RedisClusterServer`); the one Redis is measured
alone and again with a replica, which tells the cost of replication from the cost of the
cluster. Each page is what a worker asks of the state store for it: `begin` (one pipeline),
the commit script (one item entry, its children staged) and the HDEL of its staged entry; the
outbox drain is not in it (`bench.redis_cost` measures whole pages with real workers). Several
runs crawl side by side, as a fleet's do: a run's keys live on one slot, so the runs are what
spreads over the masters; their ids are drawn as `chains.run` draws them
(`RunState.new_run_id`, onto the master with the fewest active runs), and once more at random
for comparison. Figures per page: commands the masters ran (`INFO commandstats`, the scripts'
own included) and their processes' CPU (`INFO cpu`); each master's share of that CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
import redis

from config import Settings
from external_interface.dedup import RedisDedup
from ledger.state import Kid, RunState
from utils.redis import cluster_client
from utils.servers import RedisClusterServer, RedisServer

FANOUT = 10  # every page below the root has this many children until the run's pages are sent


def crawl(state: RunState, runs: int, pages: int, placed: bool = True) -> int:
    """`runs` runs of `pages // runs` pages each, interleaved page by page. -> pages done.
    `placed`: run ids from `RunState.new_run_id` (as `chains.run` draws them), else random."""
    per_run = pages // runs
    queues: dict[str, deque[dict[str, Any]]] = {}
    sent: dict[str, int] = {}
    for _ in range(runs):
        rid = state.new_run_id() if placed else uuid.uuid4().hex[:16]
        state.create_run(rid, "bench", b"{}", 5)
        staging = state.kids_key(rid, "client")
        seed = orjson.dumps(
            {"id": uuid.uuid4().hex, "task": "t", "params": {}, "meta": {"run": rid, "step": "s"}}
        )
        state.enqueue_and_release(rid, "s", [seed], staging)
        queues[rid] = deque(orjson.loads(m) for m in state.r.lrange(staging, 0, -1))
        state.r.delete(staging)
        sent[rid] = 1
    done = 0
    while any(queues.values()):
        for rid, q in queues.items():
            if not q:
                continue
            tid = q.popleft()["id"]
            state.begin(rid, tid, 0)
            n = min(FANOUT, per_run - sent[rid])
            sent[rid] += n
            kids = [
                Kid("s", "t", {"n": i}, {"run": rid, "step": "s"}, uuid.uuid4().hex)
                for i in range(n)
            ]
            entry = {
                "run": rid,
                "step": "s",
                "task": tid,
                "type": "page",
                "key": "[]",
                "items": orjson.dumps([{"tid": tid}]),
            }
            res = state.commit(
                rid=rid,
                tid=tid,
                step="s",
                outcome="succeeded",
                n_items=1,
                entries=[entry],
                kids=kids,
            )
            assert res is not None
            q.extend(orjson.loads(m) for m in res.staged)
            state.clear_kids(rid, tid)
            done += 1
    for rid in queues:
        c = state.counters(rid)
        assert c["outstanding"] == 0 and c["succeeded"] == per_run, c
    return done


def stats(nodes: list[redis.Redis]) -> list[tuple[int, float, int]]:
    """(commands run, the scripts' own included; CPU seconds of the server process; `usec` of
    the commands), per node. The per-page figure is the CPU (commandstats' `usec` of a script
    already holds its commands' own); the shares are the commands' time, which the nodes'
    idle work (cron, the cluster bus) does not blur."""
    out = []
    for n in nodes:
        cs, cpu = n.info("commandstats"), n.info("cpu")
        out.append(
            (
                sum(v["calls"] for v in cs.values()),
                cpu["used_cpu_user"] + cpu["used_cpu_sys"],
                sum(v["usec"] for v in cs.values()),
            )
        )
    return out


def measure(
    state: RunState, nodes: list[redis.Redis], runs: int, pages: int, placed: bool = True
) -> dict[str, Any]:
    for n in nodes:
        n.config_resetstat()
    before = stats(nodes)
    done = crawl(state, runs, pages, placed)
    per = [
        (c1 - c0, u1 - u0, t1 - t0)
        for (c0, u0, t0), (c1, u1, t1) in zip(before, stats(nodes), strict=True)
    ]
    calls, cpu = sum(p[0] for p in per), sum(p[1] for p in per)
    shares = [p[2] / sum(q[2] for q in per) for p in per]
    return {
        "pages": done,
        "commands_per_page": round(calls / done, 2),
        "redis_cpu_us_per_page": round(1e6 * cpu / done, 1),
        "share_per_master": [round(x, 3) for x in shares],  # of the commands' time
        "busiest_master_vs_mean": round(max(shares) * len(shares), 2),
    }


def dedup_memory(client: Any, masters: list[redis.Redis], records: int) -> dict[str, Any]:
    """Bytes of used memory per record, summed over the masters, for `records` marked ids."""
    before = [m.info("memory")["used_memory"] for m in masters]
    store = RedisDedup("bench:item", client, prefix="cb", capacity=records)
    batch = 100_000
    for lo in range(0, records, batch):
        store.mark_many([f"id-{i}" for i in range(lo, min(records, lo + batch))])
    after = [m.info("memory")["used_memory"] for m in masters]
    grown = [a - b for a, b in zip(after, before, strict=True)]
    return {
        "records": records,
        "bytes_per_record": round(sum(grown) / records, 2),
        "share_per_master": [round(g / sum(grown), 3) for g in grown],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--dedup", type=int, default=2_000_000, help="records (0: skip)")
    a = ap.parse_args(argv)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        with RedisServer(Path(tmp) / "one", appendonly=False) as one:
            client = redis.Redis.from_url(one.url)
            s = Settings(redis_url=one.url, broker_url=one.url, key_prefix="cb")
            out["one_redis"] = measure(RunState(client, s), [client], a.runs, a.pages)
            with RedisServer(Path(tmp) / "replica", appendonly=False) as rep:
                replica = redis.Redis.from_url(rep.url)
                replica.replicaof(one.host, one.port)
                while replica.info("replication").get("master_link_status") != "up":
                    time.sleep(0.05)
                client.flushall()
                out["one_redis_with_a_replica"] = measure(
                    RunState(client, s), [client], a.runs, a.pages
                )
        with RedisClusterServer(Path(tmp) / "cluster", appendonly=False) as cluster:
            client = cast(redis.Redis, cluster_client(cluster.url))  # the common commands
            s = Settings(redis_url=cluster.url, broker_url="redis://127.0.0.1:1/0", key_prefix="cb")
            masters = [n.client() for n in cluster.masters()]
            out["cluster_3_masters"] = measure(RunState(client, s), masters, a.runs, a.pages)
            out["cluster_3_masters_random_run_ids"] = measure(
                RunState(client, s), masters, a.runs, a.pages, placed=False
            )
            s_wait = s.model_copy(update={"redis_wait_replicas": 1})
            out["cluster_3_masters_wait_1"] = measure(
                RunState(client, s_wait), masters, a.runs, a.pages
            )
            if a.dedup:
                for m in masters:
                    m.config_set("slowlog-log-slower-than", -1)
                out["dedup_on_cluster"] = dedup_memory(client, masters, a.dedup)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
