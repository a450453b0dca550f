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
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from cli import UserError, procs
from config import Settings


def _demo_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def site_line(url: str, size: str, features: str) -> str:
    """The demo's line naming its site: within 80 columns with the default features (it
    wrapped in the middle of the feature list)."""
    return f"[bold]demo site[/bold]: {url} ({size}: {features or 'no anti-crawl features'})"


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
    if (pid := procs.alive(procs.run_dir(s) / "demo-site.pid")) is not None:
        was = procs.demo_url_of(procs.process_cmd(pid)) or "another port"
        print(f"demo site: stopping the one at {was} (pid {pid}) for {url}")
        procs.stop_named("demo-site", s, 30)
    cmd = [
        sys.executable,
        "-m",
        "demo",
        "--host",
        "127.0.0.1",
        "--port",
        str(a.port),
        "--size",
        a.size,
        "--features",
        a.features,
        "--latency-ms",
        str(a.latency_ms),
        "--soft-fail-rate",
        str(a.soft_fail_rate),
    ]
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
    from external_interface.storage.sinks.jsonl import default_root, read_items, type_files
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
    t.add_column(overflow="fold")  # paths and URLs wrap whole, never cut with "…"
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
    if tt.get("empty"):
        by = ", ".join(f"{sid} {c['empty']}" for sid, c in progress.steps.items() if c.get("empty"))
        t.add_row(
            "warning",
            f"{tt['empty']} page(s) yielded nothing (no item, no follow-up): "
            f"{by}; a selector that matches nothing?",
        )
    t.add_row("elapsed", f"{elapsed:.1f}s")
    t.add_row("throughput", f"{pages / elapsed:.1f} pages/s")
    files = {typ: type_files(typ, root) for typ in types}
    shown = [str(path) for typ in types for path in files[typ]]
    t.add_row(
        "items are in",
        "\n".join(shown) + f"\n(JSON Lines, one item a line; sinks: {s.sinks})"
        if shown
        else f"the sinks {s.sinks} (the JSONL store at {root} holds none)",
    )
    look = next((typ for typ in ("demo.post", *types) if files.get(typ)), None)
    if look is not None:
        t.add_row(
            "look at them",
            f"head -n 3 {files[look][0]}\n./control.sh items {look}"
            f"   (--format csv --out {look}.csv for a spreadsheet)",
        )
    if flower:
        t.add_row("flower", f"{flower[0]}  (user {s.flower_user!r}, password in {flower[1]})")
    t.add_row("stop everything", "./control.sh stop")
    return t


def show_summary(console: Console, table: Table) -> None:
    """The summary as a table when it fits; narrower (80 columns), as "label" lines with
    their values below, each value line printed whole (soft-wrapped by the terminal, never
    broken by rich inside a file name: a path stays one line to copy)."""
    natural = Measurement.get(console, console.options.update_width(100_000), table).maximum
    if natural <= console.width:
        console.print(table)
        return
    console.print(Text(str(table.title or ""), style="italic"))
    for label, value in zip(table.columns[0].cells, table.columns[1].cells, strict=True):
        console.print(Text(str(label), style="bold"))
        for line in str(value).splitlines():
            console.print(Text("  " + line), soft_wrap=True)


def check_browser(chain: str) -> None:
    """A chain with rendered steps needs Chromium and Playwright here: say what to install
    before anything starts (docs/browser.md)."""
    import chains
    from base_task import get_endpoint
    from external_interface.browser.check import problems

    rendered = [s.task for s in chains.get_chain(chain).root.walk() if get_endpoint(s.task).renders]
    missing = problems() if rendered else []
    if missing:
        raise UserError(
            f"chain {chain} renders pages in a browser ({', '.join(rendered)}): "
            + "; ".join(missing)
        )


def _workers_elsewhere(s: Settings, url: str) -> dict[str, str]:
    """Our running workers started to crawl another demo site -> its URL (`DEMO_BASE_URL`,
    read from their environment): an endpoint reads it in the worker, so they must restart."""
    out = {}
    for name, pid in procs.running("worker-", s).items():
        env = procs.process_env(pid)
        theirs = env.get("DEMO_BASE_URL", _demo_url(8700)).rstrip("/")
        if env and theirs != url:
            out[name] = theirs
    return out


def cmd_demo(a: argparse.Namespace) -> None:
    from chains.runner import Progress
    from cli import runs

    console = Console()
    s = procs.settings()
    check_browser(a.chain)
    console.print(f"[bold]redis[/bold]: {procs.ensure_redis(s)} ({s.redis_url.split('@')[-1]})")
    url = start_demo_site(s, a)
    os.environ["DEMO_BASE_URL"] = url  # reaches the workers started below
    # The polite defaults (a request rate per site, the adaptive delay) are for other people's
    # sites; the demo crawls the local demo platform, so they are off for it unless set.
    if "default_limits" not in s.model_fields_set:
        os.environ["CHAINCRAWL_DEFAULT_LIMITS"] = "off"
    if "throttle" not in s.model_fields_set:
        os.environ["CHAINCRAWL_THROTTLE"] = "off"
    console.print(site_line(url, a.size, a.features), soft_wrap=True)
    if stale := _workers_elsewhere(s, url):
        console.print(
            f"[bold]workers[/bold]: restarting {', '.join(stale)}: they crawl "
            f"{', '.join(sorted(set(stale.values())))}, this demo site is {url}"
        )
        procs.stop_named("worker-", s, 120)
    if names := list(procs.running("worker-", s)):
        # a second demo: loading the sites and pinging the workers takes seconds; say so
        with console.status(f"asking the {len(names)} worker(s) already started here…"):
            up = procs.answering_workers(names)
        console.print(
            f"[bold]workers[/bold]: {len(up)} of {len(names)} already started here "
            "answer (./control.sh stop to restart them)"
        )
    else:
        import worker

        names = procs.start_workers(s, ",".join(worker.queues()), a.pool, a.concurrency, a.workers)
        procs.wait_workers_ready(names, s)
        up = procs.answering_workers(names)
        console.print(
            f"[bold]workers[/bold]: {len(up)} x {a.pool}({a.concurrency}) running"
            + (f" ({len(names)} started)" if len(up) < len(names) else "")
        )
    if len(up) < len(names):
        quiet = ", ".join(n for n in names if n not in up)
        console.print(f"[yellow]not answering: {quiet} (see {procs.log_dir(s)})[/yellow]")
    flower = None
    if not a.no_flower:
        with console.status("starting Flower (or finding it running)…"):
            flower = procs.start_flower(s)
        console.print(f"[bold]flower[/bold]: {flower[0]}")
    progress = runs.trigger(a.chain, None, a.priority, True, a.timeout)
    assert isinstance(progress, Progress)  # waited for
    console.print()
    show_summary(console, summary(s, progress, url, flower))
    if not progress.complete:
        raise UserError(
            f"the run did not complete within {a.timeout}s; it goes on (./control.sh status)"
        )
