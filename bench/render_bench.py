"""Rendered pages against plain fetches of the same data, and the browser's memory over time.

    .venv/bin/python -m bench.render_bench                      # 200 pages per run, 1,000 for memory
    .venv/bin/python -m bench.render_bench --pages 100 --memory-pages 0 --contexts 2 --json

Starts a demo server (medium: 200 users, 2,000 posts) on a free port and one `BrowserPool`
(its driver, Playwright and the system Chromium), then runs two workloads at the same
concurrency, each both ways:

* detail: `/js/post/{pid}` rendered until its inline `window.__DATA__` is drawn, against a plain
  fetch of the same URL whose script block is read with a regular expression;
* list: `/js/feed?page=N` rendered until its script has fetched and drawn 20 entries, against a
  plain fetch of the JSON the script reads (`/js/api/feed?offset=&limit=20`).

Per run: pages per second (wall), CPU ms per page of everything that crawls (this process,
and for renders the driver, its Node.js Playwright server and Chromium's whole process tree,
reaped renderers included; the demo server is the site and reported apart), and memory (MB,
PSS) of that machinery with the MB per page in flight. Then `--memory-pages` detail pages are
rendered one context after another and the machinery's memory sampled every 25 pages: with
contexts recycled every `--context-pages` pages it must stay flat (peak against the first
hundred pages' peak). Numbers and ratios are printed; `--json` prints them as one object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

from demo.testing import DemoServer
from external_interface.browser import BrowserPool, PoolConfig, RenderRequest
from external_interface.browser.check import describe, find_executable, problems
from external_interface.browser.procmem import memory_kb, tree_cpu_seconds, tree_memory_mb
from external_interface.fetch import FetchRequest, Urllib3Fetcher

DATA = re.compile(rb"window\.__DATA__ = (.*?);</script>", re.S)
FEED_PAGE = 20


def can_render() -> bool:
    """Whether this machine can render; if not, what to install is printed."""
    missing = problems()
    if missing:
        print("\n".join(missing), file=sys.stderr)
    return not missing


def run(workers: int, n: int, one: Callable[[int], int], cpu_pids: list[int]) -> dict[str, float]:
    """`n` calls of `one(i)` on `workers` threads: wall time, items, CPU of us and `cpu_pids`."""
    cpu0 = time.process_time() + sum(tree_cpu_seconds(p) for p in cpu_pids)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        items = sum(ex.map(one, range(n)))
    wall = time.perf_counter() - t0
    cpu = time.process_time() + sum(tree_cpu_seconds(p) for p in cpu_pids) - cpu0
    return {
        "pages": n,
        "items": items,
        "seconds": wall,
        "pages_per_s": n / wall,
        "cpu_ms_per_page": 1000 * cpu / n,
    }


def machinery_mb(pool: BrowserPool | None) -> float:
    """PSS of what crawls: this process, plus the driver's whole tree for renders."""
    mb = memory_kb(os.getpid()) / 1024
    if pool is not None and pool.driver_pid:
        mb += tree_memory_mb(pool.driver_pid)
    return mb


def workloads(demo: DemoServer, pool: BrowserPool) -> dict[str, dict[str, Callable[[int], int]]]:
    fetcher = Urllib3Fetcher()
    posts = demo.config.users * demo.config.posts_per_user
    pages = -(-demo.config.users // FEED_PAGE)

    def render_post(i: int) -> int:
        res = pool.render(
            RenderRequest(
                demo.url_for(f"/js/post/p{i % posts + 1}"), wait_for="article[data-state=ready]"
            )
        )
        assert res.response.css(".post-content p::text").get()
        return 1

    def fetch_post(i: int) -> int:
        resp = fetcher.fetch(FetchRequest("GET", demo.url_for(f"/js/post/p{i % posts + 1}")))
        m = DATA.search(resp.content)
        assert m and orjson.loads(m.group(1))["post"]["content"]
        return 1

    def render_feed(i: int) -> int:
        url = demo.url_for(f"/js/feed?page={i % pages + 1}")
        res = pool.render(RenderRequest(url, wait_for=".feed[data-state=ready]"))
        return len(res.response.css(".feed-item"))

    def fetch_feed(i: int) -> int:
        url = demo.url_for(f"/js/api/feed?offset={(i % pages) * FEED_PAGE}&limit={FEED_PAGE}")
        return len(fetcher.fetch(FetchRequest("GET", url)).json()["list"])

    return {
        "detail": {"rendered": render_post, "plain": fetch_post},
        "list": {"rendered": render_feed, "plain": fetch_feed},
    }


def memory_run(pool: BrowserPool, demo: DemoServer, pages: int) -> dict[str, Any]:
    posts = demo.config.users * demo.config.posts_per_user
    samples: list[tuple[int, float, float]] = []  # (pages, machinery MB, this process MB)
    for i in range(pages):
        pool.render(
            RenderRequest(
                demo.url_for(f"/js/post/p{i % posts + 1}"), wait_for="article[data-state=ready]"
            )
        )
        if (i + 1) % 25 == 0:
            samples.append((i + 1, machinery_mb(pool), memory_kb(os.getpid()) / 1024))
    first = [mb for n, mb, _ in samples if n <= 100] or [0.0]
    st = pool.stats()
    return {
        "pages": pages,
        "peak_mb": max(mb for _, mb, _ in samples),
        "first_100_peak_mb": max(first),
        "last_mb": samples[-1][1],
        "worker_mb_first": samples[0][2],
        "worker_mb_last": samples[-1][2],
        "contexts_recycled": st.get("contexts_recycled", 0),
        "browser_restarts": st.get("recycles", 0),
        "samples": [
            {"pages": n, "mb": round(mb, 1), "worker_mb": round(w, 1)} for n, mb, w in samples
        ],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.render_bench", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--size", default="medium", help="demo size (medium: 200 users)")
    ap.add_argument("--pages", type=int, default=200, help="pages per run (200)")
    ap.add_argument("--contexts", type=int, default=2, help="browser contexts = concurrency (2)")
    ap.add_argument("--context-pages", type=int, default=100, help="pages per context (100)")
    ap.add_argument("--memory-pages", type=int, default=1000, help="pages of the memory run (1000)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    if not can_render():
        return 1
    cfg = PoolConfig.from_settings()
    cfg = PoolConfig(
        executable=find_executable(cfg.executable) or cfg.executable,
        contexts=a.contexts,
        context_pages=a.context_pages,
        memory_mb=cfg.memory_mb,
        timeout=60,
        queue_wait=60,
        block=cfg.block,
    )
    out: dict[str, Any] = {"browser": describe(), "contexts": a.contexts, "pages": a.pages}
    with DemoServer(size=a.size) as demo:
        pool = BrowserPool(cfg)
        try:
            jobs = workloads(demo, pool)
            for name, ways in jobs.items():
                for way, fn in ways.items():
                    for i in range(2 * a.contexts):  # warm: the driver, contexts, pages, caches
                        fn(i)
                    cpu_pids = [demo.proc.pid] if demo.proc else []
                    site0 = sum(tree_cpu_seconds(p) for p in cpu_pids)
                    crawl_pids = [pool.driver_pid] if way == "rendered" and pool.driver_pid else []
                    res = run(a.contexts, a.pages, fn, crawl_pids)
                    res["site_cpu_ms_per_page"] = (
                        1000 * (sum(tree_cpu_seconds(p) for p in cpu_pids) - site0) / a.pages
                    )
                    res["mb"] = machinery_mb(pool if way == "rendered" else None)
                    res["mb_per_page_in_flight"] = res["mb"] / a.contexts
                    out.setdefault(name, {})[way] = res
                r, p = out[name]["rendered"], out[name]["plain"]
                out[name]["ratio"] = {
                    "pages_per_s": p["pages_per_s"] / r["pages_per_s"],
                    "cpu_ms_per_page": r["cpu_ms_per_page"] / p["cpu_ms_per_page"],
                    "mb": r["mb"] / p["mb"],
                }
            if a.memory_pages:
                out["memory"] = memory_run(pool, demo, a.memory_pages)
            out["pool"] = pool.stats()
        finally:
            pool.close()
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"browser: {out['browser']}; {a.contexts} contexts = threads; {a.pages} pages per run")
    print(
        f"{'workload':8} {'way':9} {'pages/s':>8} {'CPU ms/page':>12} {'site ms/page':>13} {'MB':>7} {'MB/page':>8}"
    )
    for name in jobs:
        for way in ("rendered", "plain"):
            r = out[name][way]
            print(
                f"{name:8} {way:9} {r['pages_per_s']:8.1f} {r['cpu_ms_per_page']:12.1f} "
                f"{r['site_cpu_ms_per_page']:13.2f} {r['mb']:7.0f} {r['mb_per_page_in_flight']:8.0f}"
            )
        q = out[name]["ratio"]
        print(
            f"{name:8} {'ratio':9} plain is {q['pages_per_s']:.1f}x faster; a render costs "
            f"{q['cpu_ms_per_page']:.0f}x the CPU and {q['mb']:.1f}x the memory"
        )
    if a.memory_pages:
        m = out["memory"]
        print(
            f"memory over {m['pages']} rendered pages: peak {m['peak_mb']:.0f} MB (first 100 pages: "
            f"{m['first_100_peak_mb']:.0f} MB), last {m['last_mb']:.0f} MB; this process "
            f"{m['worker_mb_first']:.0f} -> {m['worker_mb_last']:.0f} MB; "
            f"{m['contexts_recycled']} contexts recycled, {m['browser_restarts']} browser restarts"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
