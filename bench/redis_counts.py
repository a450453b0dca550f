"""What `bench.redis_cost` counts, read from the servers and the processes of a crawl: each
server's commands (`INFO commandstats`) and CPU (`INFO cpu`), the commands clients send and
their key families (`MONITOR`), and the CPU of every process a crawl runs on (workers, Redis
nodes, the site, this process's proxies, the whole machine) for its pages/s and what bound it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import psutil
import redis

from bench.script_ops import ScriptOps
from utils.keyspace import Keyspace


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


def script_parts(parts: list[str], prefix: str) -> list[str]:
    """An EVAL's parts with its body as one: `MONITOR` joins a command's arguments with spaces,
    so a body's own spaces split it over many parts. Its end is found where a number of keys is
    followed by a key under `prefix` (an EVAL of no keys is left as it is)."""
    if parts[0].lower() not in ("eval", "eval_ro"):
        return parts
    for j in range(2, len(parts) - 1):
        if parts[j].isdigit() and parts[j + 1].startswith(prefix + ":"):
            return [parts[0], " ".join(parts[1:j]), *parts[j:]]
    return parts


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
        self.ops = ScriptOps()  # script calls by operation
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
        parts = script_parts(str(cmd["command"]).split(" "), self.keyspace.prefix)
        fam = self.family(parts)
        self.families[fam] += 1
        self.detail[f"{fam} {parts[0].lower()}"] += 1
        self.ops.count(parts, fam, cmd.get("client_type") == "lua")
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


def node_calls(nodes: list[redis.Redis]) -> list[int]:
    """Each node's commands run so far (`INFO commandstats`, the scripts' own included)."""
    return [sum(int(v["calls"]) for v in n.info("commandstats").values()) for n in nodes]


def process_cpu(pids: list[int]) -> float:
    """User+system CPU seconds of these processes and their live children (0 for a gone one)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            p = psutil.Process(pid)
            total += sum(p.cpu_times()[:2])
            for c in p.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    total += sum(c.cpu_times()[:2])
    return total


def machine_busy() -> float:
    """CPU seconds the whole machine spent not idle (every core, every process) so far."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


class Usage:
    """The CPU seconds and commands of a crawl's parts, read at a moment; `since` an earlier
    reading gives what a crawl cost. Parts: `masters` (each, by `INFO`), `replicas` (summed),
    `broker`, `workers` (their processes and pool children, by psutil), `site` (the demo
    server's process), `bench` (this process: the proxies' event loop, the runs' polling),
    `machine` (every core's busy time, other people's processes included)."""

    def __init__(
        self,
        masters: list[redis.Redis],
        replicas: list[redis.Redis],
        broker: redis.Redis,
        workers: list[int],
        site: list[int],
    ) -> None:
        self.wall = time.monotonic()
        self.calls = node_calls(masters)
        self.usec = node_usec(masters)
        self.cpu = server_cpu(masters)
        self.replicas = sum(server_cpu(replicas))
        self.broker = server_cpu([broker])[0]
        self.workers = process_cpu(workers)
        self.site = process_cpu(site)
        self.bench = sum(os.times()[:2])
        self.machine = machine_busy()

    def since(self, before: Usage) -> dict[str, Any]:
        """What was spent from `before` to this reading."""
        return {
            "wall": self.wall - before.wall,
            "calls": [b - a for a, b in zip(before.calls, self.calls, strict=True)],
            "usec": [b - a for a, b in zip(before.usec, self.usec, strict=True)],
            "cpu": [b - a for a, b in zip(before.cpu, self.cpu, strict=True)],
            "replicas": self.replicas - before.replicas,
            "broker": self.broker - before.broker,
            "workers": self.workers - before.workers,
            "site": self.site - before.site,
            "bench": self.bench - before.bench,
            "machine": self.machine - before.machine,
        }


def throughput(spent: list[dict[str, Any]], pages: int) -> dict[str, Any]:
    """Measured crawls' pages/s (pages over their wall clock), and each part's CPU a page and
    cores kept busy meanwhile: what bound the rate (a part near a core, or the machine near
    all of them)."""
    wall = sum(s["wall"] for s in spent)
    parts = {
        "workers": sum(s["workers"] for s in spent),
        "state_masters": sum(sum(s["cpu"]) for s in spent),
        "state_replicas": sum(s["replicas"] for s in spent),
        "broker": sum(s["broker"] for s in spent),
        "site": sum(s["site"] for s in spent),
        "bench_and_proxies": sum(s["bench"] for s in spent),
        "machine": sum(s["machine"] for s in spent),
    }
    return {
        "pages_per_s": round(pages / wall, 1) if wall else None,
        "cores": psutil.cpu_count(),
        "cpu_ms_per_page": {k: round(1000 * v / pages, 3) for k, v in parts.items()},
        "cores_busy": {k: round(v / wall, 2) for k, v in parts.items()} if wall else {},
    }


def per_master(spent: list[dict[str, Any]], pages: int) -> list[dict[str, Any]]:
    """Each master's commands, commands' time and process CPU a page over the measured
    crawls, and its share of each."""
    n = len(spent[0]["calls"])
    calls = [sum(s["calls"][i] for s in spent) for i in range(n)]
    usec = [sum(s["usec"][i] for s in spent) for i in range(n)]
    cpu = [sum(s["cpu"][i] for s in spent) for i in range(n)]

    def share(xs: list[Any], i: int) -> float:
        return round(xs[i] / sum(xs), 3) if sum(xs) else 0.0

    return [
        {
            "commands_per_page": round(calls[i] / pages, 2),
            "usec_per_page": round(usec[i] / pages, 1),
            "process_us_per_page": round(1e6 * cpu[i] / pages, 1),
            "commands_share": share(calls, i),
            "usec_share": share(usec, i),
            "cpu_share": share(cpu, i),
        }
        for i in range(n)
    ]


def busiest_vs_mean(usec: Sequence[float]) -> float:
    """The busiest master's commands' time over the masters' mean (1.0: even; 3.0: all of it
    on one of three masters; 0.0 when nothing ran)."""
    total = sum(usec)
    return round(max(usec) * len(usec) / total, 2) if total else 0.0


def balance(spent: list[dict[str, Any]]) -> dict[str, Any]:
    """The busiest master over the mean (`busiest_vs_mean`) of each measured crawl apart, the
    max and median of those, and of the crawls' time summed per master. Each crawl is a new
    run (or runs), which may land on another master: the summed figure reads more even than
    any one crawl was, and only the per-crawl ones are a run's balance."""
    per = [busiest_vs_mean(s["usec"]) for s in spent]
    summed = [sum(col) for col in zip(*(s["usec"] for s in spent), strict=True)]
    return {
        "busiest_master_vs_mean_per_crawl": per,
        "busiest_master_vs_mean_max_over_crawls": max(per),
        "busiest_master_vs_mean_median_over_crawls": round(statistics.median(per), 2),
        "busiest_master_vs_mean_crawls_summed": busiest_vs_mean(summed),
    }
