"""Instructions per page under callgrind: Scrapy against chaincrawl, free of the machine's noise.

    .venv/bin/python -m bench.instructions                      # 1,000 pages, gevent (~2 min)
    .venv/bin/python -m bench.instructions --pages 2000 --pools gevent,threads --repeat 2

Why: CPU time on a shared VM moves with the neighbours. On one machine a fixed
loop's CPU time swung 1.7x within a minute, and the cpu scenario's ratio read 0.63x, 0.84x and
0.71x in three comparisons. callgrind counts the instructions a process executes: the same
count for the same work, whatever else the machine does. Both crawlers run under `valgrind
--tool=callgrind` with instrumentation off through start-up and warm-up, switched on with the
counters zeroed for the crawl itself, and dumped at its end. The light pages of the cpu
scenario of `bench.compare` (the demo's pc pages, replayed), its concurrency and Scrapy-best,
no added latency. Under callgrind a
process runs 50-100x slower, so both crawl CPU-bound, as in that scenario.

Not counted: the kernel (system calls: sockets, and chaincrawl's Redis round trips, which
Scrapy does not make, so this ratio flatters chaincrawl), redis-server and the page server,
and what an instruction costs (cache misses, branch misses). CPU time stays the goal's
measure; this is a cross-check of its user-space part that does not move with the machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.callgrind import VALGRIND, callgrind, totals
from bench.chaincrawl_bench import ChaincrawlBench
from bench.replay_site import ReplayServer
from bench.scrapy_spider import BEST
from bench.systems import PeerProcess
from bench.workload import expected_pages, site_for_pages

CONCURRENCY = 16  # as the cpu scenario of bench.compare


def run_scrapy(demo: Any, out: Path, concurrency: int) -> dict[str, Any]:
    """Scrapy-best under callgrind: a warm-up crawl (dump 1), then the counted crawl (dump 2)."""
    argv = [
        *VALGRIND,
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "bench.scrapy_spider",
        "--config",
        BEST,
    ]
    peer = PeerProcess(argv, out.with_suffix(".log"), {"BENCH_CALLGRIND": "1"}, ready_timeout=900)
    try:
        peer.crawl(demo.url_for("/pc/user/u1"), "user", concurrency, 1800)
        demo.reset()
        res = peer.crawl(demo.url_for("/pc/feed?page=1"), "feed", concurrency, 3600)
        pages = int(demo.stats()["total"])
    finally:
        peer.close()
    return {
        "pages": pages,
        "instructions": totals(Path(f"{out}.2")),
        "cpu_ms_per_page": 1000 * res["cpu_s"] / pages,
    }


def run_chaincrawl(
    b: ChaincrawlBench, demo: Any, out_dir: Path, pool: str, concurrency: int, tag: str
) -> dict[str, Any]:
    pattern = out_dir / f"{tag}-%p.out"

    def around(start: bool) -> None:
        for w in b.workers:
            if start:
                callgrind("-i", "on", pid=w.pid)
                callgrind("-z", pid=w.pid)
            else:
                callgrind("-d", pid=w.pid)
                callgrind("-i", "off", pid=w.pid)

    try:
        r = b.crawl(
            demo,
            pool=pool,
            concurrency=concurrency,
            prefix=[*VALGRIND, f"--callgrind-out-file={pattern}"],
            in_process=True,
            around=around,
            timeout=1800,
        )
        pids = [w.pid for w in b.workers]
    finally:
        b.stop_workers()
    if r.extra.get("warning"):
        raise RuntimeError(r.extra["warning"])
    instr = sum(totals(out_dir / f"{tag}-{pid}.out.1") for pid in pids)
    return {"pages": r.pages, "instructions": instr, "cpu_ms_per_page": r.cpu_ms_per_page}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=1000, help="about this many pages (1000)")
    ap.add_argument("--pools", default="gevent", help="chaincrawl worker pools (gevent)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per system (1: counts repeat)")
    ap.add_argument("--json", help="write every run's numbers here")
    a = ap.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        ap.error("needs valgrind and callgrind_control (Debian: apt-get install valgrind)")
    users, posts, comments = site_for_pages(a.pages)
    want = expected_pages(users, posts, comments)
    pools = [p for p in a.pools.split(",") if p]
    rows: dict[str, list[dict[str, Any]]] = {}
    out_dir = Path(tempfile.mkdtemp(prefix="bench-callgrind-"))
    print(f"-- {want} pages, {CONCURRENCY} in flight, no latency; callgrind output in {out_dir}")
    try:
        site: dict[str, Any] = {
            "users": users,
            "posts_per_user": posts,
            "comments_per_post": comments,
        }
        with ChaincrawlBench() as b, ReplayServer.record(**site) as demo:
            for i in range(a.repeat):
                for label in ["scrapy", *(f"chaincrawl [{p}]" for p in pools)]:
                    if label == "scrapy":
                        res = run_scrapy(demo, out_dir / f"scrapy{i}.out", CONCURRENCY)
                    else:
                        pool = label.split("[")[1].rstrip("]")
                        res = run_chaincrawl(b, demo, out_dir, pool, CONCURRENCY, f"cc-{pool}{i}")
                    rows.setdefault(label, []).append(res)
                    print(
                        f"   {label:<22} run {i + 1}: {res['pages']} pages  "
                        f"{res['instructions'] / res['pages'] / 1e6:7.3f} M instructions/page  "
                        f"({res['cpu_ms_per_page']:.1f} ms CPU/page under callgrind)",
                        flush=True,
                    )
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    base = min(r["instructions"] / r["pages"] for r in rows["scrapy"])
    print(f"\n{'system':<22} {'M instr/page (min)':>18} {'(max)':>8} {'vs scrapy':>10}")
    for label, runs in rows.items():
        per = [r["instructions"] / r["pages"] / 1e6 for r in runs]
        ratio = "" if label == "scrapy" else f"{min(per) * 1e6 / base:.2f}x"
        print(f"{label:<22} {min(per):>18.3f} {max(per):>8.3f} {ratio:>10}")
    v = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
    print(
        f"{v}; user-space instructions of the crawler's processes only (no kernel, no Redis, "
        "no page server)"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
