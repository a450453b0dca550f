"""chaincrawl against Scrapy at its best, Crawlee for Python and the no-framework floor: the same
crawl of the same pages by every system, repeats interleaved, one table of paired ratios.

    .venv/bin/python -m bench.compare --scenarios cpu,latency,small --repeat 3 --json out.json
    .venv/bin/python -m bench.compare --quick                      # smaller page sets, 1 repeat
    .venv/bin/python -m bench.compare --scenarios cpu --pagesets heavy --scrapy-configs all
    .venv/bin/python -m bench.compare --scenarios cpu --systems chaincrawl,floor,floor-threads4
    .venv/bin/python -m bench.compare --scenarios scale --repeat 3

Scenarios (`lat250` is the old name of `latency`):
  cpu         no latency, 16 in flight; light (demo pc), shop (8 KB) and heavy (8-50 KB) page
              sets: CPU ms per page of every process of a system (chaincrawl: workers +
              redis-server), and chaincrawl / each peer per repeat.
  latency     250 ms a response, 16 in flight, 1,051 shop pages: pages/s as a share of the
              bound 16 / 0.25 s = 64 pages/s. The one-worker chaincrawl row runs 20 task slots
              with 16 fetch slots (Scrapy's CONCURRENT_REQUESTS counts downloads only).
  small       105 shop pages in 5 sequential hops on warm systems, no latency: wall time of a
              crawl. chaincrawl: `chains.run()` to `RunHandle.wait()` returning (woken by the
              run's end, as a user calls it), on workers already running and warmed (one
              worker, and the workers `start` runs: one per core); Scrapy: `runner.crawl()`
              to its deferred firing, in a process whose reactor runs and that has crawled once;
              Crawlee: `crawler.run()` to its return, likewise.
  lat100x256  100 ms latency, 256 in flight, 10,000 light pages: share of the bound
              min(2,560 pages/s, the CPU limit 1000 / CPU ms per page x workers).
  scale       no latency, 10,000 light pages: two worker processes against one, unpinned and
              with the whole stack pinned to 1 / 2 cores (pages/s, paired per repeat).

Fairness. Every page set is served from memory by `bench.replay_site` in its own process (its
CPU shown apart, never counted). Every system does the parse work of `bench.workload` (3 CSS
fields, the links, the next link, one item a page) and must fetch each page exactly once: after
each run the page server's count of requests and of distinct pages, the system's items and
pages handled are checked against the page set, and a run that misses or repeats a page is an
error, not a figure. Every system crawls the page set's warm-up subtree first, in the same
processes, before the timed crawl. Repeat i of every system runs back to back (the order
rotated each repeat), so a ratio divides runs of the same moment of the machine: ratios are
given per repeat, as min / median / max.

Scrapy-best. `--scrapy-configs all` runs every candidate of `bench.scrapy_spider.CONFIGS`
(defaults, the log level, CONCURRENT_ITEMS, the "Broad Crawls" settings, extensions and unused
middlewares off, the epoll reactor) and prints their table; the chaincrawl ratios then divide
by the candidate with the best median of the scenario's figure in that run. By default only
`scrapy_spider.BEST` runs, the candidate that measured lowest in CPU per page.

Each run's line ends with `loop A/B ms`: a fixed Python loop's CPU time just before and after
the run. On a shared machine it swings: an outlier run with a slow loop is the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import crawlee_env, pinning, scrapy_spider
from bench.chaincrawl_bench import proc_cpu, steady_rate
from bench.pagesets import PAGESETS, PageSet
from bench.protos import worker_env
from bench.systems import System, build
from utils.servers import redis_server_binary

PEERS = ("scrapy", "crawlee", "floor")


@dataclass(frozen=True)
class Scenario:
    name: str
    note: str
    pagesets: tuple[str, ...]
    latency_ms: int
    concurrency: int
    systems: tuple[str, ...]
    metric: str  # "cpu": CPU ms/page, lower is better; "rate": pages/s; "wall": seconds
    task_slots: int = 0
    warm: bool = False  # systems started once and kept over the repeats (small)
    pairs: tuple[
        tuple[str, str], ...
    ] = ()  # (numerator, denominator) keys; () = chaincrawl / peers

    def bound(self, cpu_ms: float = 0.0, workers: int = 1) -> float | None:
        if not self.latency_ms:
            return None
        b = self.concurrency * 1000 / self.latency_ms
        return min(b, 1000 / cpu_ms * workers) if self.concurrency > 64 and cpu_ms else b


SCENARIOS = {
    "cpu": Scenario("cpu", "CPU per page, no latency, 16 in flight", ("light", "shop", "heavy"),
                    0, 16, ("chaincrawl", "chaincrawl-start", "scrapy-best", "crawlee", "floor"),
                    "cpu"),
    "latency": Scenario("latency", "250 ms a response, 16 in flight", ("shop1k",), 250, 16,
                        ("chaincrawl", "scrapy-best", "crawlee"), "rate", task_slots=20),
    "small": Scenario("small", "105 pages in 5 sequential hops, warm systems", ("small",), 0, 16,
                      ("chaincrawl", "chaincrawl-start", "scrapy-best", "crawlee"), "wall",
                      warm=True),
    "lat100x256": Scenario("lat100x256", "100 ms latency, 256 in flight", ("light10k",), 100,
                           256, ("chaincrawl", "scrapy-best", "crawlee"), "rate"),
    "scale": Scenario("scale", "two worker processes against one", ("light10k",), 0, 16,
                      ("chaincrawl", "chaincrawl-x2", "chaincrawl-x1@1", "chaincrawl-x2@2"), "rate",
                      pairs=(("chaincrawl-x2", "chaincrawl"), ("chaincrawl-x2@2", "chaincrawl-x1@1"))),
}  # fmt: skip
ALIASES = {"lat250": "latency"}
METRIC = {"cpu": "cpu_ms_per_page", "rate": "pages_per_s", "wall": "wall_s"}


@dataclass
class Row:
    scenario: str
    pageset: str
    system: str  # key
    label: str
    runs: list[dict[str, Any] | None] = field(default_factory=list)  # by repeat; None: failed

    def values(self, key: str) -> list[float]:
        return [r[key] for r in self.runs if r is not None and r.get(key) is not None]

    def med(self, key: str) -> float:
        v = self.values(key)
        return statistics.median(v) if v else float("nan")

    def span(self, key: str) -> tuple[float, float, float]:
        v = self.values(key)
        return (min(v), statistics.median(v), max(v)) if v else (float("nan"),) * 3


def paired(num: Row, den: Row, key: str) -> list[float]:
    """num's run i over den's run i, for every repeat both completed: runs of the same moment."""
    return [
        a[key] / b[key]
        for a, b in zip(num.runs, den.runs, strict=False)
        if a is not None and b is not None and b.get(key)
    ]


def spread(vals: list[float]) -> tuple[float, float, float] | None:
    return (min(vals), statistics.median(vals), max(vals)) if vals else None


def best_of(rows: list[Row], prefix: str, metric: str) -> Row | None:
    """The row of a peer family (`scrapy`: every Scrapy configuration that ran) with the best
    median of the scenario's figure."""
    cands = [r for r in rows if r.system.startswith(prefix) and r.values(METRIC[metric])]
    if not cands:
        return None
    pick = max if metric == "rate" else min
    return pick(cands, key=lambda r: r.med(METRIC[metric]))


def ratio_lines(sc: Scenario, rows: list[Row]) -> list[dict[str, Any]]:
    """Each pair's ratios per repeat and their min/median/max."""
    by_key = {r.system: r for r in rows}
    pairs: list[tuple[Row, Row]] = []
    if sc.pairs:
        pairs = [(by_key[a], by_key[b]) for a, b in sc.pairs if a in by_key and b in by_key]
    else:
        peers = [p for p in (best_of(rows, fam, sc.metric) for fam in PEERS) if p is not None]
        pairs = [(cc, p) for cc in rows if cc.system.startswith("chaincrawl") for p in peers]
        if not peers and "chaincrawl" in by_key:  # chaincrawl variants only: each over the default
            base = by_key["chaincrawl"]
            pairs = [(r, base) for r in rows if r is not base and r.system.startswith("chaincrawl")]
    key = METRIC[sc.metric]
    out = []
    for num, den in pairs:
        vals = paired(num, den, key)
        out.append(
            {
                "num": num.label,
                "den": den.label,
                "metric": key,
                "per_repeat": vals,
                "spread": spread(vals),
            }
        )
    return out


def loop_ms(n: int = 200_000) -> float:
    """CPU ms of a fixed pure-Python loop: the machine's speed at this moment."""
    t = time.process_time()
    x = 0
    for i in range(n):
        x += i * i
    return 1000 * (time.process_time() - t)


def check(ps: PageSet, res: Any, stats: dict[str, Any]) -> str | None:
    """What is wrong with a run, or None: every page fetched once, one item each."""
    want = ps.expected_pages
    got = {
        "requests": stats["total"],
        "distinct pages": stats.get("distinct"),
        "pages handled": res.handled,
        "items": res.items,
    }
    bad = {k: v for k, v in got.items() if v != want}
    if stats.get("unknown"):
        bad["unknown requests"] = f"{stats['unknown']} ({stats.get('unknown_paths', [])[:3]})"
    if res.extra.get("failed"):
        bad["failed tasks"] = res.extra["failed"]
    return (
        f"expected {want} of each; got " + ", ".join(f"{k} {v}" for k, v in bad.items())
        if bad
        else None
    )


def timed_run(system: System, site: Any, ps: PageSet, sc: Scenario, start: bool) -> dict[str, Any]:
    """One measured crawl: started (and warmed) unless warm, the server's counters reset, the
    crawl, the checks. Raises RuntimeError for a run that is an error."""
    ctx = pinning.pinned(system.pin) if system.pin else contextlib.nullcontext()
    with ctx:
        if start:
            system.start(site, ps)
        site.reset()
        srv0 = proc_cpu(site.proc.pid)
        load0 = os.getloadavg()[0]
        timeout = 120 + ps.expected_pages / 5 + 20 * sc.latency_ms / 1000
        url = site.url_for(ps.seed.target)
        res = system.crawl(url, ps.seed.kind, timeout, None if sc.metric == "wall" else 0.05)
        srv = proc_cpu(site.proc.pid) - srv0
        stats = site.stats(timestamps=sc.metric == "rate")
    problem = check(ps, res, stats)
    if problem:
        raise RuntimeError(problem)
    pages = stats["total"]
    d: dict[str, Any] = {
        "pages": pages,
        "items": res.items,
        "wall_s": res.wall_s,
        "cpu_s": res.cpu_s,
        "pages_per_s": pages / res.wall_s,
        "cpu_ms_per_page": 1000 * res.cpu_s / pages,
        "cpu_parts_ms_per_page": {k: 1000 * v / pages for k, v in res.cpu_parts.items()},
        "server_cpu_ms_per_page": 1000 * srv / pages,
        "peak_rss_mb": res.peak_rss_mb,
        "load": (load0 + os.getloadavg()[0]) / 2,
        **res.extra,
    }
    if sc.metric == "rate":
        arrivals = sorted(t for e in stats["recent"]["by_ip"].values() for t in e["timestamps"])
        d["steady_pages_per_s"] = steady_rate(arrivals)
        bound = sc.bound(d["cpu_ms_per_page"], system.workers)
        d["share_of_bound"] = d["pages_per_s"] / bound if bound else None
    return d


def run_scenario(
    sc: Scenario,
    keys: list[str],
    repeat: int,
    quick: bool,
    pages: int | None,
    pagesets: list[str],
    logdir: Path,
    log: Callable[[str], None],
    protos: dict[str, dict[str, str]],
) -> list[Row]:
    rows: list[Row] = []
    for ps_name in pagesets:
        ps = PAGESETS[ps_name].build(quick, pages if sc.name == "cpu" else None)
        systems = [build(k, sc.concurrency, logdir, sc.task_slots, protos.get(k)) for k in keys]
        by_key = {s.key: Row(sc.name, ps.name, s.key, s.label) for s in systems}
        log(f"-- {sc.name} [{ps.name}: {ps.note}, {ps.expected_pages} pages]: {sc.note}")
        try:
            with ps.serve(sc.latency_ms) as site:
                if sc.warm:
                    for s in systems:
                        with pinning.pinned(s.pin) if s.pin else contextlib.nullcontext():
                            s.start(site, ps)
                for i in range(repeat):
                    order = systems[i % len(systems) :] + systems[: i % len(systems)]
                    for s in order:
                        by_key[s.key].runs.append(_one(s, site, ps, sc, i, log))
        finally:
            for s in systems:
                with contextlib.suppress(Exception):
                    s.close()
        rows += by_key.values()
    return rows


def _one(
    s: System, site: Any, ps: PageSet, sc: Scenario, i: int, log: Callable[[str], None]
) -> dict[str, Any] | None:
    speed0, t0 = loop_ms(), time.monotonic()
    try:
        d = timed_run(s, site, ps, sc, start=not sc.warm)
    except (TimeoutError, RuntimeError, OSError) as exc:
        log(f"   {s.label:<42} run {i + 1}: ERROR {str(exc)[:600]}")
        if not sc.warm:
            with contextlib.suppress(Exception):
                s.stop()
        return None
    if not sc.warm:
        s.stop()
    d["loop_ms"] = (speed0, loop_ms())
    parts = " + ".join(f"{v:.2f} {k}" for k, v in d["cpu_parts_ms_per_page"].items())
    log(
        f"   {s.label:<42} run {i + 1}: {d['pages']} pages {d['pages_per_s']:7.1f} p/s  "
        f"wall {d['wall_s']:6.2f}s  {d['cpu_ms_per_page']:6.3f} ms CPU/page ({parts})  "
        f"server {d['server_cpu_ms_per_page']:.2f}  load {d['load']:.1f}  "
        f"loop {speed0:.0f}/{d['loop_ms'][1]:.0f} ms  ({time.monotonic() - t0:.0f}s)"
    )
    return d


def _fmt(t: tuple[float, float, float] | None, prec: int = 2, unit: str = "") -> str:
    if t is None or t[0] != t[0]:
        return "-"
    return f"{t[1]:.{prec}f}{unit} ({t[0]:.{prec}f}-{t[2]:.{prec}f})"


def table(scenarios: dict[str, Scenario], rows: list[Row], meta: dict[str, Any]) -> str:
    out: list[str] = []
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.scenario, r.pageset), []).append(r)
    for (name, ps), rs in groups.items():
        sc = scenarios[name]
        out.append(f"\n{name} / {ps}: {sc.note}; median (min-max) of {meta['repeat']} repeat(s)")
        hdr = (
            f"  {'system':<42} {'CPU ms/page':>20} {'of which':>26} {'pages/s':>20} "
            f"{'wall s':>8} {'RSS MB':>7} {'vs bound':>9}"
        )
        out.append(hdr)
        for r in rs:
            parts = ""
            if r.values("cpu_ms_per_page"):
                last = next(x for x in reversed(r.runs) if x is not None)
                parts = " + ".join(
                    f"{statistics.median(x['cpu_parts_ms_per_page'][k] for x in r.runs if x):.2f} {k}"
                    for k in last["cpu_parts_ms_per_page"]
                )
            share = r.values("share_of_bound")
            out.append(
                f"  {r.label[:42]:<42} {_fmt(r.span('cpu_ms_per_page'), 2):>20} {parts:>26} "
                f"{_fmt(r.span('pages_per_s'), 0):>20} {r.med('wall_s'):8.2f} "
                f"{r.med('peak_rss_mb'):7.0f} "
                f"{(f'{100 * statistics.median(share):.1f} %' if share else ''):>9}"
                + ("" if r.values("pages") else "  (every run failed)")
            )
        if sc.bound():
            out.append(
                f"  bound: {sc.concurrency} in flight / {sc.latency_ms} ms = {sc.bound():.0f} pages/s"
                + (" (or the CPU limit, if lower)" if sc.concurrency > 64 else "")
            )
        scrapy = [r for r in rs if r.system.startswith("scrapy")]
        if len(scrapy) > 1:
            best = best_of(rs, "scrapy", sc.metric)
            out.append(
                f"  Scrapy candidates by {METRIC[sc.metric]}: "
                + ", ".join(
                    f"{r.label.split(' ', 1)[1]} {r.med(METRIC[sc.metric]):.3f}"
                    + (" <- best" if r is best else "")
                    for r in sorted(scrapy, key=lambda r: r.med(METRIC[sc.metric]))
                )
            )
        for p in ratio_lines(sc, rs):
            per = " / ".join(f"{x:.2f}" for x in p["per_repeat"]) or "-"
            sp = p["spread"]
            summary = f"min {sp[0]:.2f}, median {sp[1]:.2f}, max {sp[2]:.2f}" if sp else "no pair"
            out.append(f"  {p['num']} / {p['den']} ({p['metric']}): {summary}  [per repeat: {per}]")
    v = meta["versions"]
    out.append("\nversions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    out.append(f"load average (1/5/15 min): start {meta['load_start']}, end {meta['load_end']}")
    return "\n".join(out)


def versions() -> dict[str, str]:
    out = {
        "python": platform.python_version(),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}",
    }
    for pkg in (
        "scrapy",
        "twisted",
        "celery",
        "kombu",
        "redis",
        "urllib3",
        "parsel",
        "lxml",
        "gevent",
    ):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "-"
    for line in crawlee_env.LOCK.read_text().splitlines():
        if line.startswith("crawlee=="):
            out["crawlee"] = line.split("==", 1)[1]
    with contextlib.suppress(Exception):
        v = subprocess.run([redis_server_binary(), "--version"], capture_output=True, text=True)
        out["redis-server"] = v.stdout.split("v=")[1].split()[0]
    return out


def plan(
    names: list[str], systems: str | None, scrapy_configs: str | None, protos: list[str]
) -> list[tuple[Scenario, list[str]]]:
    """Each scenario with the system keys it runs (`--systems` replaces the scenario's own;
    `--scrapy-configs` replaces scrapy-best; `--proto` adds chaincrawl rows)."""
    out = []
    for name in names:
        sc = SCENARIOS[ALIASES.get(name, name)]
        keys = [k.strip() for k in systems.split(",") if k.strip()] if systems else list(sc.systems)
        if scrapy_configs and "scrapy-best" in keys:
            cfgs = (
                list(scrapy_spider.CONFIGS)
                if scrapy_configs == "all"
                else scrapy_configs.split(",")
            )
            i = keys.index("scrapy-best")
            keys[i : i + 1] = [f"scrapy:{c.strip()}" for c in cfgs if c.strip()]
        keys += [f"chaincrawl+{p}" for p in protos]
        out.append((sc, keys))
    return out


@contextlib.contextmanager
def _logdir(keep: Path | None) -> Iterator[Path]:
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--scenarios",
        default="cpu,latency,small",
        help=f"comma-separated: {', '.join(SCENARIOS)} (lat250 = latency)",
    )
    ap.add_argument("--repeat", type=int, default=None, help="interleaved repeats (3; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="smaller page sets, 1 repeat")
    ap.add_argument(
        "--pagesets",
        default=None,
        help=f"cpu scenario's page sets (light,shop,heavy); known: {', '.join(PAGESETS)}",
    )
    ap.add_argument("--pages", type=int, default=None, help="about this many pages per cpu crawl")
    ap.add_argument(
        "--systems",
        default=None,
        help="system keys replacing each scenario's own (bench.systems.KEYS)",
    )
    ap.add_argument(
        "--scrapy-configs",
        default=None,
        help="'all' or names from bench.scrapy_spider.CONFIGS, in place of Scrapy-best",
    )
    ap.add_argument(
        "--proto",
        action="append",
        default=[],
        help="also a chaincrawl row with these bench/proto.py flags or env:NAME=VALUE",
    )
    ap.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    ap.add_argument(
        "--logs", type=Path, default=None, help="keep the peers' logs in this directory"
    )
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if ALIASES.get(n, n) not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenarios {unknown}; known: {', '.join([*SCENARIOS, *ALIASES])}")
    repeat = a.repeat or (1 if a.quick else 3)
    signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(SystemExit(143)))
    meta: dict[str, Any] = {
        "versions": versions(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_start": tuple(round(x, 2) for x in os.getloadavg()),
        "repeat": repeat,
        "quick": a.quick,
        "scrapy_best": scrapy_spider.BEST,
    }
    protos = {f"chaincrawl+{p}": worker_env(p) for p in a.proto}
    rows: list[Row] = []
    with _logdir(a.logs) as logdir:
        for sc, keys in plan(names, a.systems, a.scrapy_configs, a.proto):
            sets = a.pagesets.split(",") if a.pagesets and sc.name == "cpu" else list(sc.pagesets)
            rows += run_scenario(
                sc,
                keys,
                repeat,
                a.quick,
                a.pages,
                sets,
                logdir,
                lambda m: print(m, flush=True),
                protos,
            )
    meta["load_end"] = tuple(round(x, 2) for x in os.getloadavg())
    print(table(SCENARIOS, rows, meta))
    if a.json:
        ratios = {
            f"{sc}/{ps}": ratio_lines(
                SCENARIOS[sc], [r for r in rows if (r.scenario, r.pageset) == (sc, ps)]
            )
            for sc, ps in dict.fromkeys((r.scenario, r.pageset) for r in rows)
        }
        a.json.write_text(
            json.dumps(
                {"meta": meta, "rows": [r.__dict__ for r in rows], "ratios": ratios},
                indent=1,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
