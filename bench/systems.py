"""The crawlers `bench.compare` runs, behind one interface of three calls.

    system.start(site, pageset)    its processes up, then a warm-up crawl of the page set's
                                   warm-up seed (every page kind on the timed path)
    system.crawl(url, kind, ...)   one timed crawl from the seed -> RunResult
    system.stop()                  its processes down

`ChaincrawlSystem`: real `celery worker` processes against a redis-server of its own (each
chaincrawl configuration has its own, so configurations can stay warm side by side); CPU is
the workers' plus redis-server's. `PeerSystem`: a peer process speaking `bench.peer_protocol`
(Scrapy, Crawlee in its own venv, the no-framework floor); CPU is that process's. The page
server is never counted. `build()` makes a system from its key (`KEYS`).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench import crawlee_env, revisions, scrapy_spider
from bench.chaincrawl_bench import ROOT, ChaincrawlBench
from bench.pagesets import PageSet
from bench.peer_protocol import READY, RESULT
from config import DEFAULT_POOL

START_CONCURRENCY = 16  # `control.sh start`'s defaults: one worker per core, -c 16
START_WORKERS = os.cpu_count() or 1


@dataclass
class RunResult:
    items: int  # items stored (chaincrawl) / in the feed, dataset or file (peers)
    handled: int  # pages the crawler processed (tasks succeeded, callbacks run)
    wall_s: float
    cpu_parts: dict[str, float]  # CPU seconds by process group, all counted
    peak_rss_mb: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu_parts.values())


class System(Protocol):
    key: str
    label: str
    pin: int  # > 0: the whole stack pinned to that many cores while it runs
    workers: int  # crawler processes (the CPU limit of a latency bound scales with them)

    def start(self, site: Any, ps: PageSet) -> None: ...
    def crawl(self, url: str, kind: str, timeout: float, poll: float | None) -> RunResult: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...


class ChaincrawlSystem:
    def __init__(
        self,
        key: str,
        label: str,
        workers: int,
        pool: str,
        concurrency: int,
        env: dict[str, str] | None = None,
        app: str = "worker",
        pin: int = 0,
        root: Path | None = None,
    ) -> None:
        self.key, self.label, self.pin, self.root = key, label, pin, root
        self.workers, self.pool, self.concurrency = workers, pool, concurrency
        self.env, self.app = env or {}, app
        self.bench: ChaincrawlBench | None = None

    def start(self, site: Any, ps: PageSet) -> None:
        if self.bench is None:
            self.bench = ChaincrawlBench()
        self.bench.flush()
        self.bench.start_workers(
            self.workers, self.pool, self.concurrency, self.app, self.env, root=self.root or ROOT
        )
        self.bench.warm_up(site.url_for(ps.warmup.target), ps.warmup.kind)

    def crawl(self, url: str, kind: str, timeout: float, poll: float | None) -> RunResult:
        assert self.bench is not None, "start() first"
        m = self.bench.measure(url, kind, timeout, poll)
        t = m["totals"]
        calls = {k: v for k, v in m["redis_calls"].items() if k not in ("hgetall", "llen", "info")}
        return RunResult(
            items=t["stored"],
            handled=t["succeeded"],
            wall_s=m["wall_s"],
            cpu_parts={"workers": sum(m["per_worker_cpu_s"]), "redis": m["redis_cpu_s"]},
            peak_rss_mb=max((w.peak_rss_mb() for w in self.bench.workers), default=0.0),
            extra={
                "failed": t["failed"],
                "retried": t["retried"],
                "redis_calls": sum(calls.values()),
                "per_worker_cpu_s": m["per_worker_cpu_s"],
            },
        )

    def stop(self) -> None:
        if self.bench is not None:
            self.bench.stop_workers()

    def close(self) -> None:
        if self.bench is not None:
            self.bench.close()
            self.bench = None


class PeerProcess:
    """A peer crawler process: requests on its stdin, results read from its stdout."""

    def __init__(
        self,
        argv: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        ready_timeout: float = 120,
    ) -> None:
        self.log = log
        self.fh = open(log, "wb")  # noqa: SIM115 - lives as long as the process
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": path, **(env or {})},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.fh,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._expect(READY, ready_timeout)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no {prefix.strip()} in {timeout:.0f}s{self._tail()}") from None
            if line is None:
                raise RuntimeError(f"peer exited {self.proc.wait()}{self._tail()}")
            if line.startswith(prefix):
                return line[len(prefix) :]

    def _tail(self) -> str:
        self.fh.flush()
        return f"; its log ({self.log}):\n" + self.log.read_text(errors="replace")[-3000:]

    def crawl(self, url: str, kind: str, concurrency: int, timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(
            json.dumps({"url": url, "kind": kind, "concurrency": concurrency}) + "\n"
        )
        self.proc.stdin.flush()
        res = json.loads(self._expect(RESULT, timeout))
        if "error" in res:
            raise RuntimeError(
                f"peer crawl failed: {res['error']}\n{res.get('traceback', '')[-2000:]}"
            )
        return res

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.fh.close()


class PeerSystem:
    def __init__(
        self,
        key: str,
        label: str,
        argv: Callable[[], list[str]],
        concurrency: int,
        logdir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.key, self.label, self.pin, self.workers = key, label, 0, 1
        self.argv, self.concurrency, self.logdir, self.env = argv, concurrency, logdir, env
        self.proc: PeerProcess | None = None
        self.runs = 0

    def start(self, site: Any, ps: PageSet) -> None:
        self.runs += 1
        name = self.key.replace(":", "-")
        self.proc = PeerProcess(self.argv(), self.logdir / f"{name}-{self.runs}.log", self.env)
        self.proc.crawl(site.url_for(ps.warmup.target), ps.warmup.kind, self.concurrency, 300)

    def crawl(self, url: str, kind: str, timeout: float, poll: float | None) -> RunResult:
        assert self.proc is not None, "start() first"
        r = self.proc.crawl(url, kind, self.concurrency, timeout)
        extra = {
            k: v
            for k, v in r.items()
            if k not in ("items", "handled", "wall_s", "cpu_s", "peak_rss_mb")
        }
        return RunResult(
            items=r["items"],
            handled=r["handled"],
            wall_s=r["wall_s"],
            cpu_parts={"crawler": r["cpu_s"]},
            peak_rss_mb=r["peak_rss_mb"],
            extra=extra,
        )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.close()
            self.proc = None

    def close(self) -> None:
        self.stop()


def _module(name: str, *args: str) -> Callable[[], list[str]]:
    return lambda: [sys.executable, "-m", name, *args]


def _crawlee() -> list[str]:
    return [str(crawlee_env.python()), "-m", "bench.crawlee_crawl"]


# the one-worker rows of another fetcher than the default: key -> CHAINCRAWL_FETCHER
FETCHER_ROWS = {
    "chaincrawl-impersonate": "impersonate",
    "chaincrawl-pycurl": "pycurl",
    "chaincrawl-urllib3": "urllib3",
}


def build(
    key: str,
    concurrency: int,
    logdir: Path,
    task_slots: int = 0,
    proto_env: dict[str, str] | None = None,
) -> ChaincrawlSystem | PeerSystem:
    """The system of `key` at the scenario's concurrency. `task_slots` > concurrency: the
    one-worker chaincrawl rows run that many task slots with `concurrency` fetch slots (Scrapy's
    CONCURRENT_REQUESTS also counts downloads, not pages being parsed)."""
    c = concurrency
    one_env = {"CHAINCRAWL_FETCH_SLOTS": str(c)} if task_slots > c else {}
    slots = max(c, task_slots)
    if key == "chaincrawl":
        return ChaincrawlSystem(
            key, f"chaincrawl 1x{DEFAULT_POOL}({c})", 1, DEFAULT_POOL, slots, one_env
        )
    if key in FETCHER_ROWS:  # every request through another fetcher (CHAINCRAWL_FETCHER)
        env = {**one_env, "CHAINCRAWL_FETCHER": FETCHER_ROWS[key]}
        label = f"chaincrawl 1x{DEFAULT_POOL}({c}) {FETCHER_ROWS[key]}"
        return ChaincrawlSystem(key, label, 1, DEFAULT_POOL, slots, env)
    if key == "chaincrawl-threads":
        return ChaincrawlSystem(key, f"chaincrawl 1xthreads({c})", 1, "threads", slots, one_env)
    if key == "chaincrawl-start":
        return ChaincrawlSystem(
            key,
            f"chaincrawl start ({START_WORKERS}x{DEFAULT_POOL}({START_CONCURRENCY}))",
            START_WORKERS,
            DEFAULT_POOL,
            START_CONCURRENCY,
        )
    if key.startswith("chaincrawl@"):  # another revision's workers: before/after in one run
        rev = key.removeprefix("chaincrawl@")
        root = revisions.checkout(rev)
        return ChaincrawlSystem(
            key,
            f"chaincrawl@{rev} 1x{DEFAULT_POOL}({c})",
            1,
            DEFAULT_POOL,
            slots,
            one_env,
            root=root,
        )
    if key.startswith("chaincrawl-x"):  # scale: chaincrawl-x2, chaincrawl-x2@2 (pinned to 2 cores)
        n, _, pin = key.removeprefix("chaincrawl-x").partition("@")
        where = f" on {pin} core{'s' if pin != '1' else ''}" if pin else ""
        return ChaincrawlSystem(
            key,
            f"chaincrawl {n}x{DEFAULT_POOL}({c}){where}",
            int(n),
            DEFAULT_POOL,
            c,
            pin=int(pin or 0),
        )
    if key.startswith("chaincrawl+"):  # with bench/proto.py switches (bench.tuned_worker)
        env = {**one_env, **(proto_env or {})}
        return ChaincrawlSystem(key, key, 1, DEFAULT_POOL, slots, env, app="bench.tuned_worker")
    if key == "scrapy-best" or key.startswith("scrapy:"):
        cfg = scrapy_spider.BEST if key == "scrapy-best" else key.removeprefix("scrapy:")
        if cfg not in scrapy_spider.CONFIGS:
            raise ValueError(
                f"unknown Scrapy configuration {cfg!r}; known: {', '.join(scrapy_spider.CONFIGS)}"
            )
        label = f"Scrapy-best ({cfg})" if key == "scrapy-best" else f"Scrapy {cfg}"
        return PeerSystem(key, label, _module("bench.scrapy_spider", "--config", cfg), c, logdir)
    if key == "crawlee":
        return PeerSystem(key, "Crawlee ParselCrawler", _crawlee, c, logdir)
    if key.startswith("floor"):
        threads = int(key.removeprefix("floor-threads") or 1) if key != "floor" else 1
        label = "floor urllib3+parsel, 1 thread" if threads == 1 else f"floor, {threads} threads"
        return PeerSystem(
            key, label, _module("bench.floor_crawl", "--threads", str(threads)), c, logdir
        )
    raise ValueError(f"unknown system {key!r}; known: {', '.join(KEYS)}")


KEYS = (
    "chaincrawl",
    "chaincrawl@REV",
    "chaincrawl-impersonate",
    "chaincrawl-pycurl",
    "chaincrawl-urllib3",
    "chaincrawl-threads",
    "chaincrawl-start",
    "chaincrawl-xN[@cores]",
    "chaincrawl+PROTO",
    "scrapy-best",
    "scrapy:CONFIG",
    "crawlee",
    "floor",
    "floor-threadsN",
)
