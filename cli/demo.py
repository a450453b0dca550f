"""`control.sh demo`: the whole system on one machine, from nothing to a summary.

Starts (or reuses) the embedded Redis, the demo platform, workers and Flower, triggers the
demo chain with a live progress bar per step, and ends with what was crawled, how fast,
where the items are and how to look at them. `control.sh stop` stops all of it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import requests
from rich.console import Console
from rich.table import Table

from cli import UserError, procs
from config import DEFAULT_POOL, Settings

DEMO_FEATURES = "ua_check,sign,device,login,soft_fail"


def _demo_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def start_demo_site(s: Settings, a: argparse.Namespace) -> str:
    url = _demo_url(a.port)
    if procs.port_open("127.0.0.1", a.port):
        try:
            requests.get(f"{url}/healthz", timeout=2).raise_for_status()
        except requests.RequestException:
            raise UserError(
                f"port {a.port} is taken by something that is not the demo site; use --port"
            ) from None
        return url
    cmd = [
        sys.executable, "-m", "demo", "--host", "127.0.0.1", "--port", str(a.port),
        "--size", a.size, "--features", a.features, "--latency-ms", str(a.latency_ms),
        "--soft-fail-rate", str(a.soft_fail_rate),
    ]  # fmt: skip
    procs.start_bg("demo-site", cmd, s)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/healthz", timeout=1).ok:
                return url
        except requests.RequestException:
            time.sleep(0.2)
    raise UserError(f"the demo site did not start; see {procs.log_dir(s) / 'demo-site.log'}")


def summary(s: Settings, progress: Any, site_url: str, flower: tuple[str, str] | None) -> Table:
    from base_task import get_endpoint
    from external_interface.sinks.jsonl import default_root, read_items
    from monitor.deadletter import DeadLetterStore
    from utils.redis import get_redis

    tt = progress.totals
    pages = tt["succeeded"] + tt["failed"] + tt["retried"]
    elapsed = max(progress.elapsed, 1e-6)
    types = sorted(
        {
            t.item_type
            for task in progress.tasks.values()
            for t in get_endpoint(task).item_types
            if t.store
        }
    )
    exp_items = requests.get(f"{site_url}/admin/config", timeout=5).json().get("expected", {})
    dls = [
        d
        for d in DeadLetterStore(get_redis(), s).list(10**6)
        if d.meta.get("run") == progress.run_id
    ]
    t = Table(
        title=f"demo crawl summary · run {progress.run_id}", title_justify="left", show_header=False
    )
    t.add_column(style="bold")
    t.add_column()
    t.add_row("chain", progress.chain)
    t.add_row(
        "pages fetched", f"{pages} ({tt['retried']} of them retries after soft failures or bans)"
    )
    t.add_row("tasks", f"{tt['succeeded']} succeeded, {tt['failed']} failed (dead-lettered)")
    root = default_root()
    for typ in types:
        n = len(read_items(typ, root))
        short = typ.split(".")[-1] + "s"
        exp = exp_items.get(short)
        t.add_row(
            f"items {typ}", f"{n}" + (f" (the demo site has {exp})" if exp is not None else "")
        )
    t.add_row("items stored this run", f"{tt['stored']} of {tt['items']} produced")
    if dls:
        errs: dict[str, int] = {}
        for d in dls:
            errs[d.error_type] = errs.get(d.error_type, 0) + 1
        t.add_row(
            "errors",
            ", ".join(f"{k}: {v}" for k, v in errs.items()) + "  (./control.sh deadletter list)",
        )
    else:
        t.add_row("errors", "none")
    t.add_row("elapsed", f"{elapsed:.1f}s")
    t.add_row("throughput", f"{pages / elapsed:.1f} pages/s")
    t.add_row("items are in", f"{root}/<type>/*.jsonl (JSON Lines; sinks: {s.sinks})")
    t.add_row(
        "look at them", f"head -n 3 {root}/demo_post/*.jsonl   or   ./control.sh items demo.post"
    )
    if flower:
        t.add_row("flower", f"{flower[0]}  (user {s.flower_user!r}, password in {flower[1]})")
    t.add_row("stop everything", "./control.sh stop")
    return t


def cmd_demo(a: argparse.Namespace) -> None:
    from cli import runs

    console = Console()
    s = procs.settings()
    console.print(f"[bold]redis[/bold]: {procs.ensure_redis(s)} ({s.redis_url.split('@')[-1]})")
    url = start_demo_site(s, a)
    os.environ["DEMO_BASE_URL"] = url  # reaches the workers started below
    console.print(f"[bold]demo site[/bold]: {url} (size {a.size}, features {a.features or 'none'})")
    if procs.running("worker-", s):
        console.print("[bold]workers[/bold]: already running (./control.sh stop to restart them)")
    else:
        import worker

        names = procs.start_workers(s, ",".join(worker.queues()), a.pool, a.concurrency, a.workers)
        procs.wait_workers_ready(names, s)
        console.print(f"[bold]workers[/bold]: {len(names)} x {a.pool}({a.concurrency})")
    flower = None
    if not a.no_flower:
        flower = procs.start_flower(s)
        console.print(f"[bold]flower[/bold]: {flower[0]}")
    progress = runs.trigger(a.chain, None, a.priority, True, a.timeout)
    console.print()
    console.print(summary(s, progress, url, flower))
    if not progress.complete:
        raise UserError(
            f"the run did not complete within {a.timeout}s; it goes on (./control.sh status)"
        )


def cmd_items(a: argparse.Namespace) -> None:
    from external_interface.sinks.jsonl import read_items

    items = read_items(a.type)
    if not items:
        raise UserError(f"no stored items of type {a.type!r} in the JSONL sink")
    for item in items[-a.limit :]:
        print(item)
    print(f"({len(items)} {a.type} items in all)", file=sys.stderr)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the demo crawl on the embedded defaults")
    p.add_argument("--size", default="small", help="demo site size: tiny, small, medium, large")
    p.add_argument("--chain", default="demo_social", help="chain to run (demo_social)")
    p.add_argument("--features", default=DEMO_FEATURES,
                   help=f"demo anti-crawl features ({DEMO_FEATURES}); '' for none")  # fmt: skip
    p.add_argument("--soft-fail-rate", type=float, default=0.02)
    p.add_argument("--latency-ms", type=float, default=20.0, help="demo site latency per response")
    p.add_argument("--port", type=int, default=8700, help="demo site port (8700)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--pool", default=DEFAULT_POOL, help=f"worker pool ({DEFAULT_POOL})")
    p.add_argument("--priority", type=int, default=None)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--no-flower", action="store_true")
    p.set_defaults(fn=cmd_demo)
    it = sub.add_parser("items", help="print stored items of a type from the JSONL sink")
    it.add_argument("type", help="item type, e.g. demo.post")
    it.add_argument("--limit", type=int, default=10)
    it.set_defaults(fn=cmd_items)
