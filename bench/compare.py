"""Scrapy vs chaincrawl on the demo platform, back to back in one run, one table of ratios.

    .venv/bin/python -m bench.compare                 # every scenario, 2 repeats (~10 min)
    .venv/bin/python -m bench.compare --quick         # smaller sites, 1 repeat (~3 min)
    .venv/bin/python -m bench.compare --scenarios cpu,lat250 --repeat 3 --json out.json
    .venv/bin/python -m bench.compare --proto all --proto all,batch   # adds rows with prototypes
    .venv/bin/python -m bench.compare --quick --scenarios scale --server both

Scenarios (the issue's goals):
  cpu         no added latency, 16 in flight: Scrapy (CONCURRENT_REQUESTS=16) vs a gevent(16)
              worker. Goal: chaincrawl CPU/page <= 0.8 x Scrapy's.
  lat250      250 ms latency, 16 in flight: bound 16/0.25 = 64 pages/s. Goal >= 95 % of it.
              chaincrawl runs 20 task slots with 16 fetch slots (CHAINCRAWL_FETCH_SLOTS), as
              Scrapy's 16 count downloads only; the "in flt" column is the most requests the
              page server saw at once.
  lat100x256  100 ms latency, 256 in flight: Scrapy at 256 vs a gevent(256) worker; bound
              min(2560 pages/s, CPU limit = 1000 / CPU ms per page). Goal >= 90 % of it.
              10,000 pages: the site's first levels (1, then 21 pages) are latency-bound for
              any crawler, and with the last wave they cost a fixed ~0.3 s, which in a
              3,000-page crawl of 3 s was 7-10 % of a fast crawler's run (the faster, the more).
  scale       no latency, 16 slots, 10,000 pages: two worker processes vs one. Goal >= 1.8x.
              Rows `x1`/`x2` run unpinned: the one worker then has a second core to itself
              for redis-server and the page server, which two workers must share, so the
              ratio is bounded by 2w/(w+o) (w: worker CPU/page, o: the rest's). Rows
              `x1 on 1 core`/`x2 on 2 cores` pin the whole stack (driver, redis-server, page
              server, workers) to the first n cores: what another core and worker add.
              Configurations alternate run by run, with new workers each run (`--no-pin`
              leaves the pinned rows out).

Pools (`--pools`, default gevent,threads): chaincrawl runs once per pool, at the same
concurrency, in every scenario but lat100x256 (gevent only); rows of a pool other than the
default (gevent) are tagged, e.g. `[threads]`. The threads pool pays for GIL hand-offs: every lxml XPath call and socket
operation releases the GIL and another of the 16 threads takes it on the other core (an XPath
query costs 2.6-4x the CPU with 2-16 threads as with one); a gevent worker runs one OS thread.

Page server (`--server`): `demo` is the demo platform (aiohttp, demo/); `replay` is
bench/replay_site.py, the same pages byte for byte (recorded from a demo server just before,
which is then stopped) served from memory by a bare asyncio protocol, at a fraction of the
demo's CPU per page. `auto` (the default) uses replay for `scale` and demo for the others: on a
2-core machine the demo server's ~0.3 ms CPU/page takes a quarter of a core from two workers,
so the scale ratio would measure the CPU the server leaves over; the CPU/page figures of the
other scenarios count the crawler's processes only and are not changed by the server. `both`
runs every scenario against each. Within one scenario and server, every system crawls the
same server process. The server's CPU per page (psutil, over the timed run) is a column.

Every run starts the page server in its own process (and, for chaincrawl, a private
redis-server and the worker processes): per-page CPU counts the crawler's processes only
(Scrapy's one process; the chaincrawl workers), redis-server and page-server CPU are shown
apart. CPU time, not wall time, is the per-page cost: the machine is shared. Each figure is
the median of the repeats (the minimum CPU/page is shown too: contention only ever adds to it).
Each run's line ends with `loop A/B ms`: a fixed Python loop's CPU time just before and just
after the run (`loop_ms`). On a shared VM it swings (1.7x within a minute in the ninth
session), so an outlier run with a slow loop is the machine, not the crawler.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import pinning
from bench.chaincrawl_bench import ChaincrawlBench, proc_cpu, steady_rate
from bench.workload import expected_pages, site_for_pages
from config import DEFAULT_POOL

ROOT = Path(__file__).resolve().parent.parent
SCRAPY_TUNED = ["CONCURRENT_ITEMS=16"]


@dataclass
class Scenario:
    name: str
    latency_ms: int
    concurrency: int
    pages: int
    quick_pages: int
    pool: str | None = None  # None: every pool of `--pools`; else this one only
    workers: int = 1
    scrapy: bool = True
    note: str = ""
    server: str = "demo"  # the page server of `--server auto`
    # chaincrawl's task slots per worker when more than `concurrency`, which then caps its
    # requests in flight instead (CHAINCRAWL_FETCH_SLOTS): Scrapy's CONCURRENT_REQUESTS also
    # counts downloads only, not pages being parsed
    task_slots: int = 0

    def bound(self) -> float | None:
        return self.concurrency * 1000 / self.latency_ms if self.latency_ms else None


SCENARIOS = {
    "cpu": Scenario("cpu", 0, 16, 2000, 600, note="CPU per page, 16 in flight, no latency"),
    "lat250": Scenario(
        "lat250", 250, 16, 1300, 420, task_slots=20, note="250 ms latency, 16 in flight"
    ),
    "lat100x256": Scenario(
        "lat100x256", 100, 256, 10000, 1000, pool="gevent", note="100 ms latency, 256 in flight"
    ),
    "scale": Scenario(
        "scale",
        0,
        16,
        10000,
        600,
        workers=2,
        scrapy=False,
        note="two worker processes vs one (cpu scenario)",
        server="replay",
    ),
}


@dataclass
class Row:
    scenario: str
    system: str
    server: str = "demo"
    runs: list[dict[str, Any]] = field(default_factory=list)

    def med(self, key: str) -> float:
        vals = [r[key] for r in self.runs if r.get(key) is not None]
        return statistics.median(vals) if vals else float("nan")

    def min(self, key: str) -> float:
        vals = [r[key] for r in self.runs if r.get(key) is not None]
        return min(vals) if vals else float("nan")

    def max(self, key: str) -> float:
        vals = [r[key] for r in self.runs if r.get(key) is not None]
        return max(vals) if vals else float("nan")


def versions() -> dict[str, str]:
    out = {
        "python": platform.python_version(),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}",
    }
    for pkg in ("scrapy", "twisted", "celery", "kombu", "redis", "hiredis", "requests", "urllib3",
                "parsel", "lxml", "pydantic", "orjson", "gevent", "psutil"):  # fmt: skip
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "-"
    try:
        from utils.servers import redis_server_binary

        v = subprocess.run([redis_server_binary(), "--version"], capture_output=True, text=True)
        out["redis-server"] = v.stdout.split("v=")[1].split()[0] if "v=" in v.stdout else "?"
    except Exception:
        out["redis-server"] = "?"
    return out


def run_scrapy(demo: Any, concurrency: int, settings: list[str], prefix: Sequence[str] = (),
               env: Mapping[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """One Scrapy crawl of `demo` in its own process; `prefix` wraps the command (valgrind for
    `bench.instructions`), `env` is added to the process's environment."""
    demo.reset()
    load0 = os.getloadavg()[0]
    sets = [x for kv in settings for x in ("-s", kv)]
    cmd = [*prefix, sys.executable, "-m", "bench.scrapy_spider", "--base", demo.url,
           "-c", str(concurrency), "--json", "--log-level", "WARNING", *sets]  # fmt: skip
    out = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True,
                         text=True, check=False)  # fmt: skip
    res = None
    for line in out.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            res = json.loads(line[len("BENCH_RESULT ") :])
    if res is None:
        raise RuntimeError(f"Scrapy run failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    stats = demo.stats(timestamps=True)
    arrivals = sorted(t for e in stats["recent"]["by_ip"].values() for t in e.get("timestamps", []))
    res["steady_pages_per_s"] = steady_rate(arrivals)
    res["server_pages"] = stats["total"]
    res["load"] = (load0 + os.getloadavg()[0]) / 2
    res["peak_rss_mb_max"] = res["peak_rss_mb"]
    res["cpu_util"] = res["cpu_s"] / res["wall_s"] if res["wall_s"] else 0.0
    res["returncode"] = out.returncode
    return res


def run_chaincrawl(b: ChaincrawlBench, demo: Any, sc: Scenario, workers: int, proto: str,
                   keep: bool, pool: str | None = None) -> dict[str, Any]:  # fmt: skip
    from bench.protos import _env

    load0 = os.getloadavg()[0]
    env = _env(proto)
    proto = env.get("BENCH_PROTO", "")
    slots = sc.concurrency
    if sc.task_slots > sc.concurrency:
        slots = sc.task_slots
        env = {**env, "CHAINCRAWL_FETCH_SLOTS": str(sc.concurrency)}
    r = b.crawl(demo, pool=pool or sc.pool, concurrency=slots, workers=workers, env=env,
                app="bench.tuned_worker" if proto else "worker", keep_workers=keep)  # fmt: skip
    d = r.as_dict()
    d["steady_pages_per_s"] = steady_rate(d["extra"].pop("arrivals"))
    d["load"] = (load0 + os.getloadavg()[0]) / 2
    d["peak_rss_mb_max"] = max(r.peak_rss_mb) if r.peak_rss_mb else 0.0
    d["cpu_util"] = r.cpu_s / r.wall_s if r.wall_s else 0.0
    calls = d["extra"].pop("redis_calls", {})
    d["redis_calls_per_page"] = (
        sum(v for k, v in calls.items() if k not in ("hgetall", "llen", "info")) / r.pages
        if r.pages else 0.0
    )  # fmt: skip
    return d


class Metered:
    """The page server as the runners see it, plus its CPU over the timed run: every runner
    calls `reset()` just before its timed crawl (after any warm-up) and `stats()` just after."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.cpu0: float | None = None
        self.cpu1: float | None = None
        self.last: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)

    def reset(self) -> None:
        self.server.reset()
        self.cpu0, self.cpu1 = proc_cpu(self.server.proc.pid), None

    def stats(self, *args: Any, **kw: Any) -> dict[str, Any]:
        self.cpu1 = proc_cpu(self.server.proc.pid)
        self.last = self.server.stats(*args, **kw)
        return self.last

    def take(self, res: dict[str, Any]) -> None:
        """Add the server's CPU (and any requests it could not answer) to a run's result."""
        if self.cpu0 is not None and self.cpu1 is not None:
            res["server_cpu_s"] = self.cpu1 - self.cpu0
            res["server_cpu_ms_per_page"] = (
                1000 * res["server_cpu_s"] / res["pages"] if res.get("pages") else None
            )
        if self.last.get("max_in_flight") is not None:  # what the site saw, not what we set
            res["server_peak_in_flight"] = self.last["max_in_flight"]
        if self.last.get("unknown"):
            res.setdefault("extra", {})["warning"] = (
                f"replay server: {self.last['unknown']} requests for unrecorded pages, e.g. "
                f"{self.last.get('unknown_paths', [])[:3]}"
            )
        self.cpu0 = self.cpu1 = None
        self.last = {}


def loop_ms(n: int = 200_000) -> float:
    """CPU ms of a fixed pure-Python loop: the machine's speed at this moment. A shared VM's
    speed swings (1.7x within a minute has been seen), so each run's line shows it
    before and after, and an outlier run can be told from a slow moment of the machine."""
    t = time.process_time()
    x = 0
    for i in range(n):
        x += i * i
    return 1000 * (time.process_time() - t)


def servers_for(choice: str, sc: Scenario) -> list[str]:
    """The page server(s) a scenario runs against under `--server choice`."""
    if choice == "auto":
        return [sc.server]
    if choice == "both":
        return ["demo", "replay"]
    return [choice]


@contextlib.contextmanager
def page_server(kind: str, users: int, posts: int, comments: int, latency_ms: int,
                log: Any = print) -> Iterator[Any]:  # fmt: skip
    """A started page server (own process) of this site: the demo platform or its replay."""
    site = {"users": users, "posts_per_user": posts, "comments_per_post": comments,
            "latency_ms": latency_ms}  # fmt: skip
    if kind == "demo":
        from demo.testing import DemoServer

        with DemoServer(**site, stats_window_s=3600) as demo:
            yield demo
        return
    from bench.replay_site import ReplayServer

    t0 = time.monotonic()
    replay = ReplayServer.record(**site)
    log(f"   (replay server: {len(replay.pages)} pages recorded from the demo server in "
        f"{time.monotonic() - t0:.1f}s; demo server stopped)")  # fmt: skip
    with replay:
        yield replay


def run_all(names: list[str], quick: bool, repeat: int, protos: list[str], scrapy_defaults: bool,
            log: Any = print, plain: bool = True, server: str = "auto",
            pools: tuple[str, ...] = (DEFAULT_POOL,), pin: bool = True) -> tuple[list[Row], dict[str, Any]]:  # fmt: skip
    rows: list[Row] = []
    meta: dict[str, Any] = {"versions": versions(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                            "load_start": os.getloadavg(), "quick": quick, "repeat": repeat,
                            "scrapy_settings": SCRAPY_TUNED, "proto": protos,
                            "server": server, "pools": pools}  # fmt: skip
    cc_names = {"chaincrawl": ""}
    for proto in protos:
        cc_names[f"cc+proto({proto})"] = proto
    with ChaincrawlBench() as b:
        for name in names:
            sc = SCENARIOS[name]
            pages = sc.quick_pages if quick else sc.pages
            users, posts, comments = site_for_pages(pages)
            systems: list[tuple[str, Any]] = []
            if sc.scrapy:
                systems.append(
                    ("scrapy", lambda d, sc=sc: run_scrapy(d, sc.concurrency, SCRAPY_TUNED))
                )
                if scrapy_defaults and name == "cpu":
                    systems.append(
                        ("scrapy (defaults)", lambda d, sc=sc: run_scrapy(d, sc.concurrency, []))
                    )
            if plain and name == "cpu":
                for batch in (1, 20):
                    systems.append((f"celery plain, {batch} page(s)/task",
                                    lambda d, batch=batch, sc=sc: _plain(b, d, sc, batch)))  # fmt: skip
            # the scenario's own pool first (lat100x256: gevent only; 256 threads make no sense)
            sc_pools = [sc.pool] if sc.pool else list(dict.fromkeys(pools))
            for pool in sc_pools:
                tag = "" if pool == DEFAULT_POOL or len(sc_pools) == 1 else f" [{pool}]"
                for label, pr in cc_names.items():
                    if name == "scale":
                        for nw in (1, sc.workers):
                            systems.append((f"{label}{tag} x{nw}", _cc(b, sc, nw, pr, pool)))
                        if pin and pinning.supported() and sc.workers <= len(pinning.allowed()):
                            for nw in (1, sc.workers):
                                systems.append((f"{label}{tag} x{nw} {_cores(nw)}",
                                                _cc(b, sc, nw, pr, pool, pin=nw)))  # fmt: skip
                    else:
                        systems.append((f"{label}{tag}", _cc(b, sc, sc.workers, pr, pool)))
            for kind in servers_for(server, sc):
                log(f"-- {name} [{kind} server]: {sc.note}; site U={users} P={posts} C={comments} "
                    f"({expected_pages(users, posts, comments)} pages)")  # fmt: skip
                by_label = {label: Row(name, label, kind) for label, _ in systems}
                with page_server(kind, users, posts, comments, sc.latency_ms, log) as srv:
                    demo = Metered(srv)
                    # chaincrawl configurations keep their workers over repeats: group by
                    # config; but scale interleaves its configurations (new workers every run),
                    # as its ratio divides runs and the machine's speed drifts between them
                    order = (
                        [(label, fn, i) for i in range(repeat) for label, fn in systems]
                        if name == "scale"
                        else [(label, fn, i) for label, fn in systems for i in range(repeat)]
                    )
                    for label, fn, i in order:
                        speed0 = loop_ms()
                        t0 = time.monotonic()
                        try:
                            res = (
                                fn(demo, i > 0 and name != "scale")
                                if label.startswith(("chaincrawl", "cc+"))
                                else fn(demo)
                            )
                        except (TimeoutError, RuntimeError) as exc:
                            log(f"   {label:<34} run {i + 1}: FAILED {str(exc)[:300]}")
                            if label.startswith(("chaincrawl", "cc+")):
                                b.stop_workers()
                            continue
                        demo.take(res)
                        res["loop_ms"] = (speed0, loop_ms())
                        by_label[label].runs.append(res)
                        srv_ms = res.get("server_cpu_ms_per_page")
                        log(f"   {label:<34} run {i + 1}: {res['pages']} pages "
                            f"{res['pages_per_s']:7.1f} p/s  {res['cpu_ms_per_page']:6.2f} ms CPU/page  "
                            f"server {_f(srv_ms if srv_ms is not None else float('nan'), 4, 2)} ms/page  "
                            f"in flight {res.get('server_peak_in_flight', '-')}  "
                            f"load {res['load']:.1f}  loop {speed0:.0f}/{res['loop_ms'][1]:.0f} ms  "
                            f"({time.monotonic() - t0:.0f}s)"
                            + (f"  WARNING {res['extra']['warning']}" if res.get("extra", {}).get("warning") else ""))  # fmt: skip
                        last = i == repeat - 1 or name == "scale"
                        if last and label.startswith(("chaincrawl", "cc+")):
                            b.stop_workers()
                rows += by_label.values()
    meta["load_end"] = os.getloadavg()
    return rows, meta


def _plain(b: ChaincrawlBench, demo: Any, sc: Scenario, batch: int) -> dict[str, Any]:
    from bench.plain_celery import crawl

    load0 = os.getloadavg()[0]
    res = crawl(b, demo, batch, sc.concurrency)
    res["load"] = (load0 + os.getloadavg()[0]) / 2
    res["peak_rss_mb_max"] = res["peak_rss_mb"]
    res["cpu_util"] = res["cpu_s"] / res["wall_s"] if res["wall_s"] else 0.0
    return res


def _cc(b: ChaincrawlBench, sc: Scenario, workers: int, proto: str, pool: str,
        pin: int = 0) -> Any:  # fmt: skip
    """A chaincrawl configuration; `pin` > 0: the whole stack on that many cores for the run."""
    if not pin:
        return lambda demo, keep: run_chaincrawl(b, demo, sc, workers, proto, keep, pool)

    def run(demo: Any, keep: bool) -> dict[str, Any]:
        with pinning.pinned(pin):
            return run_chaincrawl(b, demo, sc, workers, proto, keep, pool)

    return run


def _cores(n: int) -> str:
    return f"on {n} core{'s' if n > 1 else ''}"


def scale_base(system: str) -> str:
    """The one-worker row a scale row is divided by: "x2 on 2 cores" -> "x1 on 1 core"."""
    m = re.fullmatch(r"(.*) x\d+( on \d+ cores?)?", system)
    if not m:
        return system
    return f"{m.group(1)} x1" + (f" {_cores(1)}" if m.group(2) else "")


def scale_pairs(rs: list[Row]) -> list[str]:
    """The ratio of each repeat's pair (x2 run i over x1 run i: the runs are interleaved, so a
    pair shares the machine's moment), their median, and runs whose CPU per page strays more
    than 10 % from their row's median: a noisy moment the fixed loop around a run can miss."""
    lines = []
    by_name = {r.system: r for r in rs}
    for r in rs:
        one = by_name.get(scale_base(r.system))
        if one is None or one is r:
            continue
        pairs = zip(one.runs, r.runs, strict=False)  # a failed run leaves its row shorter
        ratios = [b["pages_per_s"] / a["pages_per_s"] for a, b in pairs
                  if a.get("pages_per_s") and b.get("pages_per_s")]  # fmt: skip
        if not ratios:
            continue
        odd = [f"{row.system.split(' ', 1)[1]} run {i + 1} {run['cpu_ms_per_page']:.2f} ms"
               for row in (one, r) for i, run in enumerate(row.runs)
               if run.get("cpu_ms_per_page")
               and abs(run["cpu_ms_per_page"] / row.med("cpu_ms_per_page") - 1) > 0.10]  # fmt: skip
        lines.append(
            f"{'':<18} {r.system}: pairs "
            + " ".join(f"{x:.2f}x" for x in ratios)
            + f", median {statistics.median(ratios):.2f}x"
            + (f"; CPU/page off its row's median by >10 %: {', '.join(odd)}" if odd else "")
        )
    return lines


def _f(x: float, width: int, prec: int = 1) -> str:
    return f"{x:{width}.{prec}f}" if x == x else f"{'-':>{width}}"


def table(rows: list[Row], meta: dict[str, Any]) -> str:
    out = []
    by_sc: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        by_sc.setdefault((r.scenario, r.server), []).append(r)
    hdr = (f"{'scenario':<11} {'server':<6} {'system':<34} {'pages/s':>8} {'steady':>7} {'CPU ms/pg':>9} "
           f"{'(min)':>6} {'redis ms/pg':>11} {'server ms/pg':>12} {'peak RSS MB':>11} {'in flt':>6} {'vs bound':>8} "
           f"{'CPU vs scrapy':>13} {'p/s vs scrapy':>13} {'CPU util':>8} {'load':>5}")  # fmt: skip
    out.append(hdr)
    out.append("-" * len(hdr))
    for (name, server), rs in by_sc.items():
        sc = SCENARIOS[name]
        scrapy = next((r for r in rs if r.system == "scrapy"), None)
        for r in rs:
            cpu, pps = r.med("cpu_ms_per_page"), r.med("pages_per_s")
            bound = sc.bound()
            vs_bound = ""
            if bound:
                limit = min(bound, 1000 / cpu * sc.workers) if name == "lat100x256" else bound
                vs_bound = f"{100 * pps / limit:6.1f}%"
            rel_cpu = (
                f"{cpu / scrapy.med('cpu_ms_per_page'):.2f}x" if scrapy and r is not scrapy else ""
            )
            rel_pps = (
                f"{pps / scrapy.med('pages_per_s'):.2f}x" if scrapy and r is not scrapy else ""
            )
            base = scale_base(r.system) if name == "scale" else r.system
            if base != r.system:
                one = next((x for x in rs if x.system == base), None)
                if one:
                    rel_pps = f"{pps / one.med('pages_per_s'):.2f}x 1w"
            redis_ms = r.med("redis_cpu_ms_per_page")
            out.append(
                f"{name:<11} {server:<6} {r.system[:34]:<34} {pps:8.1f} {_f(r.med('steady_pages_per_s'), 7)} "
                f"{cpu:9.2f} {r.min('cpu_ms_per_page'):6.2f} "
                f"{(f'{redis_ms:.2f}' if redis_ms == redis_ms else '-'):>11} "
                f"{_f(r.med('server_cpu_ms_per_page'), 12, 2)} {r.med('peak_rss_mb_max'):11.1f} "
                f"{_f(r.max('server_peak_in_flight'), 6, 0)} "
                f"{vs_bound:>8} {rel_cpu:>13} {rel_pps:>13} "
                f"{100 * r.med('cpu_util'):7.0f}% {r.med('load'):5.1f}"
            )
        if name == "scale":
            out += scale_pairs(rs)
        if sc.bound():
            extra = (
                " (or the CPU limit 1000/CPU-ms, whichever is lower)"
                if name == "lat100x256"
                else ""
            )
            out.append(
                f"{'':<18} bound = {sc.concurrency} in flight / {sc.latency_ms} ms = {sc.bound():.0f} pages/s{extra}"
            )
    v = meta["versions"]
    out.append("")
    out.append("versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    out.append(f"load average (1/5/15 min): start {tuple(round(x, 2) for x in meta['load_start'])}, "
               f"end {tuple(round(x, 2) for x in meta['load_end'])}; Scrapy settings: "
               f"{', '.join(meta['scrapy_settings'])} (+ bench/scrapy_spider.py defaults)")  # fmt: skip
    return "\n".join(out)


def _log(msg: str) -> None:
    print(msg, flush=True)


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sites, 1 repeat")
    ap.add_argument("--repeat", type=int, default=None, help="runs per system (2; --quick: 1)")
    ap.add_argument("--scenarios", default="cpu,lat250,lat100x256,scale")
    ap.add_argument("--proto", action="append", default=[],
                    help="also run chaincrawl with these bench/proto.py flags (comma-separated, "
                         "env:NAME=VALUE for worker settings); repeat for more rows")  # fmt: skip
    ap.add_argument("--no-scrapy-defaults", action="store_true",
                    help="skip the Scrapy-with-default-settings row of the cpu scenario")  # fmt: skip
    ap.add_argument("--no-plain", action="store_true",
                    help="skip the plain-Celery calibration rows of the cpu scenario")  # fmt: skip
    ap.add_argument("--server", choices=("auto", "demo", "replay", "both"), default="auto",
                    help="page server: the demo platform or bench/replay_site.py's replay of it; "
                         "auto = replay for scale, demo for the rest")  # fmt: skip
    ap.add_argument("--pools", default=f"{DEFAULT_POOL},threads",
                    help="worker pools to run chaincrawl with where the scenario allows (all but "
                         "lat100x256, which is gevent); rows of other pools are tagged [pool]")  # fmt: skip
    ap.add_argument("--no-pin", action="store_true",
                    help="skip the scale scenario's rows with the whole stack pinned to n cores")  # fmt: skip
    ap.add_argument("--json", type=Path, default=None, help="write every run's numbers here")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    repeat = a.repeat or (1 if a.quick else 2)
    signal.signal(signal.SIGTERM, _exit_on_term)  # workers and servers are stopped on the way out
    rows, meta = run_all(names, a.quick, repeat, a.proto, not a.no_scrapy_defaults, log=_log,
                         plain=not a.no_plain, server=a.server, pin=not a.no_pin,
                         pools=tuple(p.strip() for p in a.pools.split(",") if p.strip()))  # fmt: skip
    print()
    print(table(rows, meta))
    if a.json:
        a.json.write_text(
            json.dumps({"meta": meta, "rows": [r.__dict__ for r in rows]}, indent=1, default=str)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
