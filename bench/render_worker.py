"""Rendered pages through a real worker, against plain fetches of the same data.

    .venv/bin/python -m bench.render_worker                 # 1,000 posts each way
    .venv/bin/python -m bench.render_worker --pages 200 --contexts 2 --json

Where `bench.render_bench` times the browser pool alone, this runs whole endpoint tasks on a
real `celery worker` (gevent, a private Redis, the demo platform `medium`): each post once as
`demo.js.detail` (`ctx.render` of `/js/post/{pid}` until its script has drawn it: the task,
its gate and providers, the browser pool, its driver and Chromium, the commit, the outbox) and
once as `demo.h5.detail` (`ctx.get` of the same post's JSON), one task per post, `contexts`
browser contexts and twice as many task slots. The plain run comes first, so its tree is the
worker alone (a worker that never renders never starts a browser).

Per way: pages per second (wall, from the run's start to its items stored), CPU ms per page of
the worker's whole process tree (the worker, and for renders the driver, Playwright's Node.js
server and Chromium, reaped renderers included; the demo server and Redis apart), and memory
sampled every half second: the worker process alone and its whole tree (PSS, MB), peak and
last. Over a long rendered run the tree must stay flat within context recycling
(CHAINCRAWL_BROWSER_CONTEXT_PAGES): its peak is reported beside the first hundred pages' peak.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaincrawl_bench import ChaincrawlBench, Worker
from bench.render_bench import can_render
from demo.testing import DemoServer
from external_interface.browser.check import describe
from external_interface.browser.procmem import memory_kb, tree_cpu_seconds, tree_memory_mb

WAYS = {"rendered": "demo.js.detail", "plain": "demo.h5.detail"}


class Sampler:
    """Memory of a worker (alone, and with its tree) every `every` seconds, tagged with the
    run's progress (tasks done)."""

    def __init__(self, pid: int, done: Any, every: float = 0.5) -> None:
        self.pid, self.done, self.every = pid, done, every
        self.samples: list[tuple[int, float, float]] = []  # (pages done, worker MB, tree MB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append((self.done(), memory_kb(self.pid) / 1024, tree_memory_mb(self.pid)))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def crawl(bench: ChaincrawlBench, worker: Worker, task: str, pids: list[str]) -> dict[str, Any]:
    """One run of `task` over `pids`, one task per post; what it cost the worker."""
    from chains import Chain, run, step

    chain = Chain(f"render_worker_{task}", step(task))
    cpu0 = tree_cpu_seconds(worker.pid)
    t0 = time.monotonic()
    handle = run(chain, seeds=[{"post_id": p} for p in pids])
    step_id = chain.root.id
    with Sampler(worker.pid, lambda: handle.progress().steps[step_id]["succeeded"]) as mem:
        p = handle.wait(timeout=120 + 2 * len(pids), poll=0.1)
    wall = time.monotonic() - t0
    cpu = tree_cpu_seconds(worker.pid) - cpu0
    n = p.steps[step_id]["succeeded"]
    samples = mem.samples or [(n, memory_kb(worker.pid) / 1024, tree_memory_mb(worker.pid))]
    first = [tree for done, _, tree in samples if done <= 100] or [samples[0][2]]
    return {
        "pages": n,
        "failed": p.totals["failed"],
        "retried": p.totals["retried"],
        "stored": p.totals["stored"],
        "seconds": wall,
        "pages_per_s": n / wall,
        "cpu_ms_per_page": 1000 * cpu / max(n, 1),
        "worker_mb_peak": max(w for _, w, _ in samples),
        "worker_mb_last": samples[-1][1],
        "tree_mb_peak": max(t for _, _, t in samples),
        "tree_mb_first_100_peak": max(first),
        "tree_mb_last": samples[-1][2],
        "samples": len(samples),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.render_worker", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--size", default="medium", help="demo size (medium: 2,000 posts)")
    ap.add_argument("--pages", type=int, default=1000, help="posts, each crawled both ways")
    ap.add_argument("--contexts", type=int, default=2, help="browser contexts (2)")
    ap.add_argument("--context-pages", type=int, default=100, help="pages per context (100)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    if not can_render():
        return 1
    out: dict[str, Any] = {"browser": describe(), "contexts": a.contexts, "pages": a.pages}
    with DemoServer(size=a.size) as demo, ChaincrawlBench() as bench:
        posts = demo.config.users * demo.config.posts_per_user
        if a.pages > posts:
            print(f"--pages {a.pages}: the {a.size} demo has {posts} posts", file=sys.stderr)
            return 2
        env = {
            **bench.env,
            "DEMO_BASE_URL": demo.url,
            "CHAINCRAWL_BROWSER_CONTEXTS": str(a.contexts),
            "CHAINCRAWL_BROWSER_CONTEXT_PAGES": str(a.context_pages),
            "CHAINCRAWL_BROWSER_SITE_LIMIT": "off",  # the cost of a render, not the site's cap
            "CHAINCRAWL_PROVIDERS": "user_agent=noop",
        }
        bench.workdir.joinpath("logs").mkdir(parents=True, exist_ok=True)
        worker = Worker(
            env,
            bench.workdir / "logs" / "render.log",
            "gevent",
            2 * a.contexts,
            "render1",
            queue="demo",
        ).wait_ready()
        try:
            bench._client()
            warm = [f"p{posts - i}" for i in range(2 * a.contexts)]  # not among the measured
            pids = [f"p{i + 1}" for i in range(a.pages)]
            for way in ("plain", "rendered"):  # plain first: its tree is the worker alone
                crawl(bench, worker, WAYS[way], warm)  # connections, the driver, contexts
                out[way] = crawl(bench, worker, WAYS[way], pids)
        finally:
            worker.stop()
    r, p = out["rendered"], out["plain"]
    out["ratio"] = {
        "pages_per_s": p["pages_per_s"] / r["pages_per_s"],
        "cpu_ms_per_page": r["cpu_ms_per_page"] / p["cpu_ms_per_page"],
        "tree_mb_peak": r["tree_mb_peak"] / p["tree_mb_peak"],
    }
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"browser: {out['browser']}; one gevent worker, {a.contexts} contexts, "
        f"{2 * a.contexts} task slots; {a.pages} posts each way"
    )
    print(
        f"{'way':9} {'pages/s':>8} {'CPU ms/page':>12} {'worker MB peak':>15} "
        f"{'tree MB peak':>13} {'tree MB last':>13}"
    )
    for way in ("rendered", "plain"):
        x = out[way]
        print(
            f"{way:9} {x['pages_per_s']:8.1f} {x['cpu_ms_per_page']:12.1f} "
            f"{x['worker_mb_peak']:15.1f} {x['tree_mb_peak']:13.0f} {x['tree_mb_last']:13.0f}"
        )
    q = out["ratio"]
    print(
        f"a rendered page: {q['cpu_ms_per_page']:.0f}x the CPU, {q['tree_mb_peak']:.1f}x the "
        f"memory; plain is {q['pages_per_s']:.1f}x faster; the tree's peak in the first 100 "
        f"rendered pages {r['tree_mb_first_100_peak']:.0f} MB, over all {r['tree_mb_peak']:.0f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
