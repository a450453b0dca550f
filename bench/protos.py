"""Measure core changes one at a time (each switched off by its setting) on the cpu scenario.

    .venv/bin/python -m bench.protos                                  # every flag, 2 rounds
    .venv/bin/python -m bench.protos --flags noevents,rawpublish --rounds 3 --pages 1500
    .venv/bin/python -m bench.protos --cumulative                     # add flags one by one
    .venv/bin/python -m bench.protos --latency-ms 250 --flags env:CHAINCRAWL_PREFETCH_MULTIPLIER=4

Each round runs every configuration once (baseline first), so slow drifts of the machine's
load hit all of them alike; the table shows the median and the minimum worker CPU ms/page and
the saving against the baseline measured in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaincrawl_bench import ChaincrawlBench
from bench.workload import site_for_pages
from config import DEFAULT_POOL

# each configuration switches one core change off again (or metrics off: an upper bound)
DEFAULT_FLAGS = (
    "env:CHAINCRAWL_TASK_EVENTS=1,env:CHAINCRAWL_TASK_LOG=1,"
    "env:CHAINCRAWL_FETCHER=requests,env:CHAINCRAWL_BATCH=1,nometrics"
)


def worker_env(spec: str) -> dict[str, str]:
    """Worker environment of a configuration: proto flags, and `env:NAME=VALUE` tokens as
    environment variables (e.g. `env:CHAINCRAWL_PREFETCH_MULTIPLIER=4`). In --flags, a
    configuration is one comma-separated entry; join flags within it with `+`."""
    env: dict[str, str] = {}
    flags = []
    for tok in filter(None, (t.strip() for t in spec.replace("+", ",").split(","))):
        if tok.startswith("env:"):
            k, _, v = tok[4:].partition("=")
            env[k] = v
        else:
            flags.append(tok)
    if flags:
        env["BENCH_PROTO"] = ",".join(flags)
    return env


def main(argv: list[str] | None = None) -> int:
    from demo.testing import DemoServer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flags", default=DEFAULT_FLAGS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pages", type=int, default=1500)
    ap.add_argument("--latency-ms", type=int, default=0)
    ap.add_argument("-P", "--pool", default=DEFAULT_POOL)
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--cumulative", action="store_true", help="flag sets grow one flag at a time")
    ap.add_argument("--no-all", action="store_true", help="skip the all-flags configuration")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(SystemExit(143)))
    flags = [f.strip() for f in a.flags.split(",") if f.strip()]
    configs: list[tuple[str, str]] = [("baseline", "")]
    if a.cumulative:
        acc: list[str] = []
        for f in flags:
            acc.append(f)
            configs.append(("+" + f, ",".join(acc)))
    else:
        configs += [(f, f) for f in flags]
        if not a.no_all:
            configs.append(("all", "all"))
    users, posts, comments = site_for_pages(a.pages)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in configs}
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
        for rnd in range(a.rounds):
            for name, proto in configs:
                env = worker_env(proto)
                proto = env.get("BENCH_PROTO", "")
                try:
                    r = b.crawl(
                        demo,
                        pool=a.pool,
                        concurrency=a.concurrency,
                        env=env,
                        app="bench.tuned_worker" if proto else "worker",
                    )
                except (TimeoutError, RuntimeError) as exc:
                    print(f"round {rnd + 1} {name:<14} FAILED: {str(exc)[:200]}", flush=True)
                    b.stop_workers()
                    continue
                b.stop_workers()
                d = r.as_dict()
                d.pop("extra", None)
                d["load"] = os.getloadavg()[0]
                results[name].append(d)
                print(
                    f"round {rnd + 1} {name:<14} {r.pages} pages {r.pages_per_s:7.1f} p/s "
                    f"{r.cpu_ms_per_page:6.2f} ms CPU/page  redis {d['redis_cpu_ms_per_page']:.2f}"
                    f"  load {d['load']:.1f}"
                    + (f"  WARNING {r.extra['warning']}" if r.extra.get("warning") else ""),
                    flush=True,
                )
    base = [x["cpu_ms_per_page"] for x in results["baseline"]]
    base_med = statistics.median(base) if base else float("nan")
    print(
        f"\n{'config':<16} {'flags':<60} {'CPU ms/page':>11} {'(min)':>6} {'saving':>8} "
        f"{'redis ms/pg':>11} {'pages/s':>8}"
    )
    for name, proto in configs:
        runs = results[name]
        if not runs:
            print(f"{name:<16} {proto:<60} (no successful run)")
            continue
        cpu = [x["cpu_ms_per_page"] for x in runs]
        med = statistics.median(cpu)
        print(
            f"{name:<16} {proto[:60]:<60} {med:11.2f} {min(cpu):6.2f} "
            f"{(f'{100 * (1 - med / base_med):7.1f}%' if name != 'baseline' else ''):>8} "
            f"{statistics.median(x['redis_cpu_ms_per_page'] for x in runs):11.2f} "
            f"{statistics.median(x['pages_per_s'] for x in runs):8.1f}"
        )
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
