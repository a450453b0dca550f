"""The line protocol between `bench.compare` and a peer crawler's process (Scrapy, Crawlee,
the no-framework floor). Standard library only: the Crawlee peer runs it in its own venv.

The peer prints `BENCH_READY` once imported, then answers each request line on stdin (JSON:
`url`, `kind`, `concurrency`) with one `BENCH_RESULT {json}` line: `items` stored, `handled`
pages, `wall_s` and `cpu_s` from the crawl's start to its end (user+system CPU of the whole
process, every thread, plus waited-for children), `peak_rss_mb` (VmHWM); or `error`. It exits at the end
of stdin. One process serves every crawl of a run (the warm-up, then the timed crawl), so a
crawl is timed on a warm interpreter, as chaincrawl's warm workers are.
"""

from __future__ import annotations

import json
import resource
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

READY = "BENCH_READY"
RESULT = "BENCH_RESULT "


def cpu_s() -> float:
    """User+system CPU seconds of this process (all threads) and its waited-for children."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def peak_rss_mb() -> float:
    """VmHWM, the peak resident set since exec (getrusage's ru_maxrss keeps the forking
    parent's peak across exec on Linux: the driver's, with every page set in memory)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Clock:
    """Wall and CPU from `Clock()` to `result()`: one crawl's cost as the peer reports it."""

    def __init__(self) -> None:
        self.t0, self.cpu0 = time.monotonic(), cpu_s()

    def result(self, items: int, handled: int, **extra: Any) -> dict[str, Any]:
        wall, cpu = time.monotonic() - self.t0, cpu_s() - self.cpu0
        rss = peak_rss_mb()
        return {
            "items": items,
            "handled": handled,
            "wall_s": wall,
            "cpu_s": cpu,
            "peak_rss_mb": rss,
            **extra,
        }


def serve(crawl: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Answer crawl requests from stdin until it ends."""
    print(READY, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            res = crawl(json.loads(line))
        except Exception as exc:  # the host reports it with the peer's log
            res = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        print(RESULT + json.dumps(res), flush=True)
