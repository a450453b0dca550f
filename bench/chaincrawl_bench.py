"""The chaincrawl side of the benchmark: the workload of `bench.workload` as a chain run on real
worker processes against a private Redis.

    .venv/bin/python -m bench.chaincrawl_bench --latency-ms 0 -c 16                # threads
    .venv/bin/python -m bench.chaincrawl_bench --latency-ms 100 -c 256 -P gevent
    .venv/bin/python -m bench.chaincrawl_bench --workers 2 --users 100
    .venv/bin/python -m bench.chaincrawl_bench --app bench.tuned_worker --proto nometrics

Chain `bench_pc` (built here, carried in the run record):

    feed ─> user ─> post ─> comments          every step: task `benchsite.pc.page`
                                              (bench/site/pc/page.py), `unique`, fed by the
                                              parent's `benchsite.link` items; next pages are
                                              follow-ups of the same step

A full chain step per page: Celery message in, parameter validation, fetch (urllib3), parse
(parsel CSS), items, the dedup check of unique children (SADD in the commit script), the commit
Lua (items to the outbox stream, children staged and returned, counters), child publish
(batched while the backlog is deep), ack; the outbox
drainer thread writes items to the JSONL sink and counts them stored.

Measured per run, after a warm-up run on the same workers:
  * CPU: user+system of every worker process (and its children) from `psutil`, delta over the
    run; also the private redis-server's CPU and the demo server's (reported apart, never
    included in the per-page figure, as with Scrapy).
  * wall: from `chains.run()` to the run being complete (tasks done, items stored).
  * pages: requests the demo server counted (must equal the chain's succeeded tasks).
  * peak RSS per worker: VmHWM from /proc.
Workers are started as `control.sh start` starts them (`celery -A worker worker -P ...
-l INFO --without-gossip`, `-E` only with CHAINCRAWL_TASK_EVENTS=1), with the app module
replaceable by `--app`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from bench.workload import expected_pages, kinds_from
from config import DEFAULT_POOL, Settings
from utils import environ
from utils.worker_cmd import READY_MARKER, worker_argv

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "benchsite"


def _flags(env: dict[str, str]) -> set[str]:
    from bench.proto import flags

    return flags(env.get("BENCH_PROTO", ""))


def commandstats(url: str) -> dict[str, int]:
    """Redis INFO commandstats: calls per command."""
    import redis

    info = redis.Redis.from_url(url).info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


def proc_cpu(pid: int) -> float:
    """User+system CPU seconds of a process and its live children (prefork pool)."""
    try:
        p = psutil.Process(pid)
        total = sum(p.cpu_times()[:2])
        for c in p.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                total += sum(c.cpu_times()[:2])
        return total
    except psutil.NoSuchProcess:
        return 0.0


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a process, in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Worker:
    """A real `celery worker` process (own session, so it can be stopped as a group)."""

    def __init__(
        self,
        env: dict[str, str],
        log: Path,
        pool: str,
        concurrency: int,
        name: str,
        app: str = "worker",
        extra: list[str] | None = None,
        prefix: list[str] | None = None,
        queue: str = QUEUE,
        events: bool | None = None,
        in_process: bool = False,
        root: Path = ROOT,
    ) -> None:
        """`root`: the checkout whose code the worker runs (another revision's, bench.revisions).
        `prefix` wraps the command (e.g. `py-spy record ... --`): `pid` is then its child,
        unless the wrapper runs the worker in its own process (`in_process`: valgrind)."""
        self.log = log
        self.wrapped = bool(prefix) and not in_process
        if events is None:  # as control.sh starts workers: -E only with CHAINCRAWL_TASK_EVENTS
            events = Settings.from_environ({**os.environ, **env}).task_events
        cmd = [
            *(prefix or []),
            *worker_argv(
                app=app,
                pool=pool,
                concurrency=concurrency,
                queues=queue,
                node=f"{name}@%h",
                events=events,
                extra=extra or (),
            ),
        ]
        self.fh = open(log, "wb")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            cmd,
            cwd=root,
            env={**os.environ, **env},
            stdout=self.fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        if not self.wrapped:
            return self.proc.pid
        for _ in range(100):
            kids = psutil.Process(self.proc.pid).children()
            if kids:
                return kids[0].pid
            time.sleep(0.05)
        raise RuntimeError("wrapped worker has no child process")

    def wait_ready(self, timeout: float = 90) -> Worker:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY_MARKER.encode() in self.log.read_bytes():
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited {self.proc.returncode}:\n{self.text()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"worker not ready in {timeout}s:\n{self.text()[-3000:]}")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def cpu(self) -> float:
        return proc_cpu(self.pid)

    def peak_rss_mb(self) -> float:
        return peak_rss_mb(self.pid)

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            if self.wrapped:  # stop the worker; the wrapper (profiler) then writes and exits
                with contextlib.suppress(ProcessLookupError, RuntimeError, psutil.Error):
                    os.kill(self.pid, signal.SIGTERM)
            else:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.fh.close()


@dataclass
class CrawlResult:
    system: str
    pages: int
    items: int
    wall_s: float
    cpu_s: float
    workers: int
    pool: str
    concurrency: int
    peak_rss_mb: list[float]
    redis_cpu_s: float
    succeeded: int
    failed: int
    retried: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_ms_per_page(self) -> float:
        return 1000 * self.cpu_s / self.pages if self.pages else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["pages_per_s"] = self.pages_per_s
        d["cpu_ms_per_page"] = self.cpu_ms_per_page
        d["redis_cpu_ms_per_page"] = 1000 * self.redis_cpu_s / self.pages if self.pages else 0.0
        return d


class ChaincrawlBench:
    """A private redis-server for the whole session; workers started per configuration."""

    _active: ClassVar[ChaincrawlBench | None] = None  # whose Redis this process's client uses

    def __init__(
        self,
        workdir: Path | None = None,
        key_prefix: str = "bench",
        redis_binary: str | None = None,
    ) -> None:
        from utils.servers import RedisServer

        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="bench-cc-"))
        self.redis = RedisServer(self.workdir / "redis", binary=redis_binary).start()
        self.key_prefix = key_prefix
        self.env = {
            "CHAINCRAWL_REDIS_URL": self.redis.url,
            "CHAINCRAWL_KEY_PREFIX": key_prefix,
            "CHAINCRAWL_EXTRA_SITE_PACKAGES": "bench.site",
            "CHAINCRAWL_VAR_DIR": str(self.workdir / "var"),
            "CHAINCRAWL_SINKS": "jsonl",
            # the engine at full speed, as Scrapy's side runs without AutoThrottle or robots
            "CHAINCRAWL_DEFAULT_LIMITS": "off",
            "CHAINCRAWL_THROTTLE": "off",
            "CHAINCRAWL_ROBOTS": "off",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self._client_ready = False
        self._saved_env: dict[str, str | None] = {}
        self.workers: list[Worker] = []

    # -- the client side (this process): chain runs and progress
    def _client(self) -> None:
        """This process as a client of this bench's Redis (the last one asked, when several
        benches with Redis servers of their own run side by side, as `bench.compare`'s do)."""
        if self._client_ready:
            return
        if ChaincrawlBench._active is not None:
            ChaincrawlBench._active._restore_client()
        ChaincrawlBench._active = self
        # close() puts these back: a bench run inside a test must not leave its sites and
        # Redis to the tests that follow in the same process
        self._saved_env = environ.apply(self.env)
        from config import get_settings, reset_settings
        from utils.redis import reset_clients

        reset_settings()
        reset_clients()
        import sites
        import worker

        sites.load_all()
        worker.configure(get_settings())
        self._client_ready = True

    def chain(self, kind: str = "feed") -> Any:
        """The chain of a crawl seeded at a page of `kind`: one step per page kind it walks
        (`bench.workload.kinds_from`), each fed by its parent's `benchsite.link` items."""
        from chains import Chain, step

        link = {"unique": True, "on": "benchsite.link"}
        task = "benchsite.pc.page"
        kinds = kinds_from(kind)
        node = None
        for k in reversed(kinds[1:]):
            s = step(task, _id=k, url="url", _const={"kind": k}, _options=link)
            node = s if node is None else s.then(node)
        root = step(task, _id=kind)
        return Chain(
            "bench_pc" if kind == "feed" else f"bench_{kind}",
            root if node is None else root.then(node),
        )

    def run_chain(
        self, seeds: list[dict[str, str]], timeout: float, poll: float | None = 0.05
    ) -> tuple[float, Any]:
        """Run the chain of the seeds' kind; wall seconds from `chains.run()` to `wait()`
        returning (`poll` None: `wait()`'s own default, as a user calls it)."""
        from chains import run

        self._client()
        chain = self.chain(seeds[0]["kind"])
        t0 = time.monotonic()
        handle = run(chain, seeds=seeds, priority=5)
        progress = (
            handle.wait(timeout=timeout)
            if poll is None
            else handle.wait(timeout=timeout, poll=poll)
        )
        return time.monotonic() - t0, progress

    # -- workers
    def start_workers(
        self,
        n: int,
        pool: str,
        concurrency: int,
        app: str = "worker",
        env: dict[str, str] | None = None,
        extra: list[str] | None = None,
        prefix: list[str] | None = None,
        in_process: bool = False,
        root: Path = ROOT,
        queue: str = QUEUE,
    ) -> list[Worker]:
        """`queue`: the queues they serve, comma-separated (the bench site's by default)."""
        self.stop_workers()
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            # the worker's number last, before the `@`: threads workers pin to core n-1 by it
            name = f"bench{int(time.time() * 1000) % 100000}-{i + 1}"
            self.workers.append(
                Worker(
                    {**self.env, **(env or {})},
                    logs / f"{name}.log",
                    pool,
                    concurrency,
                    name,
                    app,
                    extra,
                    prefix,
                    queue=queue,
                    in_process=in_process,
                    root=root,
                )
            )
        for w in self.workers:
            w.wait_ready()
        return self.workers

    def stop_workers(self) -> None:
        for w in self.workers:
            w.stop()
        self.workers = []

    def flush(self) -> None:
        import redis

        redis.Redis.from_url(self.redis.url).flushall()

    def close(self) -> None:
        self.stop_workers()
        self.redis.stop()
        if self._client_ready:
            self._restore_client()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _restore_client(self) -> None:
        from config import reset_settings
        from utils.redis import reset_clients

        environ.restore(self._saved_env)
        reset_settings()
        reset_clients()
        self._client_ready = False
        if ChaincrawlBench._active is self:
            ChaincrawlBench._active = None

    def __enter__(self) -> ChaincrawlBench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one measured crawl
    def warm_up(self, url: str, kind: str, timeout: float = 120) -> None:
        """A run over a subtree of the crawl on the running workers: every code path, pool and
        connection warmed before a timed crawl."""
        self.run_chain([{"url": url, "kind": kind}], timeout)

    def measure(
        self, url: str, kind: str, timeout: float, poll: float | None = 0.05
    ) -> dict[str, Any]:
        """One timed run from `url` on the running workers: wall, the workers' CPU and
        redis-server's (psutil deltas), the run's totals, Redis calls by command."""
        redis_pid = self.redis.proc.pid if self.redis.proc else 0
        cpu0 = [w.cpu() for w in self.workers]
        rcpu0 = proc_cpu(redis_pid)
        cmd0 = commandstats(self.redis.url)
        wall, progress = self.run_chain([{"url": url, "kind": kind}], timeout, poll)
        cpu1 = [w.cpu() for w in self.workers]
        rcpu1 = proc_cpu(redis_pid)
        cmd1 = commandstats(self.redis.url)
        return {
            "wall_s": wall,
            "per_worker_cpu_s": [b - a for a, b in zip(cpu0, cpu1, strict=True)],
            "redis_cpu_s": rcpu1 - rcpu0,
            "totals": progress.totals,
            "redis_calls": {
                k: v - cmd0.get(k, 0) for k, v in cmd1.items() if v - cmd0.get(k, 0) > 0
            },
        }

    def crawl(
        self,
        demo: Any,
        *,
        pool: str = DEFAULT_POOL,
        concurrency: int = 16,
        workers: int = 1,
        app: str = "worker",
        env: dict[str, str] | None = None,
        warmup: bool = True,
        timeout: float | None = None,
        label: str = "chaincrawl",
        keep_workers: bool = False,
        prefix: list[str] | None = None,
        in_process: bool = False,
        around: Callable[[bool], None] | None = None,
    ) -> CrawlResult:
        """Start workers (unless `keep_workers` and they run), warm up, crawl the demo's pc
        pages (`demo`: a DemoServer or its replay), measure.
        `around(True)` / `around(False)` just before / after the timed crawl."""
        if not (keep_workers and self.workers):
            self.flush()
            self.start_workers(
                workers, pool, concurrency, app, env, prefix=prefix, in_process=in_process
            )
        self._client()
        cfg = demo.config
        want = expected_pages(cfg.users, cfg.posts_per_user, cfg.comments_per_post)
        if timeout is None:  # generous: 5 pages/s plus the latency chain of the tree
            timeout = 60 + want / 5 + 20 * cfg.latency_ms / 1000
        if warmup:  # one user's pages: every code path, pools and connections warmed
            self.warm_up(demo.url_for("/pc/user/u1"), "user", timeout)
        demo.reset()
        if around is not None:
            around(True)
        m = self.measure(demo.url_for("/pc/feed?page=1"), "feed", timeout)
        if around is not None:
            around(False)
        stats = demo.stats(timestamps=True)
        t = m["totals"]
        pages = int(stats["total"])
        res = CrawlResult(
            system=label,
            pages=pages,
            items=t["stored"],
            wall_s=m["wall_s"],
            cpu_s=sum(m["per_worker_cpu_s"]),
            workers=workers,
            pool=pool,
            concurrency=concurrency,
            peak_rss_mb=[round(w.peak_rss_mb(), 1) for w in self.workers],
            redis_cpu_s=m["redis_cpu_s"],
            succeeded=t["succeeded"],
            failed=t["failed"],
            retried=t["retried"],
            extra={
                "expected_pages": want,
                "per_worker_cpu_s": m["per_worker_cpu_s"],
                "arrivals": _arrivals(stats),
                "redis_calls": m["redis_calls"],
            },
        )
        if pages != want or t["succeeded"] != want or t["stored"] != want:
            res.extra["warning"] = (
                f"expected {want} pages/tasks/items, got {pages} requests, "
                f"{t['succeeded']} tasks, {t['stored']} items stored"
            )
        return res


def _arrivals(stats: dict[str, Any]) -> list[float]:
    out: list[float] = []
    for entry in stats.get("recent", {}).get("by_ip", {}).values():
        out += entry.get("timestamps", [])
    return sorted(out)


def steady_rate(arrivals: list[float], lo: float = 0.05, hi: float = 0.95) -> float:
    """Requests/s between the lo and hi quantiles of arrival times (ramp-up and tail cut)."""
    n = len(arrivals)
    if n < 20:
        return 0.0
    i, j = int(n * lo), int(n * hi) - 1
    span = arrivals[j] - arrivals[i]
    return (j - i) / span if span > 0 else 0.0


def main(argv: list[str] | None = None) -> int:
    from bench.workload import site_for_pages
    from demo.testing import DemoServer

    ap = argparse.ArgumentParser(description="chaincrawl side of the crawl benchmark")
    ap.add_argument("--latency-ms", type=int, default=0)
    ap.add_argument("-P", "--pool", default=DEFAULT_POOL)
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--pages", type=int, default=2000, help="about this many pages")
    ap.add_argument("--json-arrivals", action="store_true", help="keep server arrival times")
    ap.add_argument("--app", default="worker", help="Celery app module (bench.tuned_worker)")
    ap.add_argument("--proto", default="", help="BENCH_PROTO for bench.tuned_worker")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(SystemExit(143)))
    users, posts, comments = site_for_pages(a.pages)
    env = {"BENCH_PROTO": a.proto} if a.proto else {}
    with (
        DemoServer(
            users=users,
            posts_per_user=posts,
            comments_per_post=comments,
            latency_ms=a.latency_ms,
            stats_window_s=3600,
        ) as demo,
        ChaincrawlBench() as b,
    ):
        for i in range(a.repeat):
            r = b.crawl(
                demo,
                pool=a.pool,
                concurrency=a.concurrency,
                workers=a.workers,
                app=a.app,
                env=env,
                keep_workers=i > 0,
            )
            d = r.as_dict()
            arrivals = d["extra"]["arrivals"] if a.json_arrivals else d["extra"].pop("arrivals")
            d["steady_pages_per_s"] = steady_rate(arrivals)
            print(json.dumps(d, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
