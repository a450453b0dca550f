"""Measurement-only switches applied at worker start (`bench/tuned_worker.py`, `BENCH_PROTO`).

The prototypes this module used to hold (noevents, quietlog, rawpublish, commitkids, evalsha,
batchpublish, urllib3, orjson, brokerpool, lazyattrs, batch) are now in the core
(docs/performance.md, "Now in the core"); each can be switched off there through a setting,
which is how `bench.protos` measures it now:

    CHAINCRAWL_TASK_EVENTS=1   task events back on (-E; noevents)
    CHAINCRAWL_TASK_LOG=1      per-task INFO lines back on (quietlog)
    CHAINCRAWL_FETCHER=requests  the requests fetcher (urllib3)
    CHAINCRAWL_BATCH=1         one page per message (batch)

Flags left here:
    nometrics   task metrics are dropped instead of aggregated (an upper bound of what any
                cheaper metrics could still save)
    waits       diagnostic, gevent pool: counts every switch into the hub (a greenlet waiting)
                by greenlet and by the code that waited, written to /tmp/waits-<pid>.txt
                ($BENCH_WAITS_OUT) when the worker stops (docs/performance.md)
    slots       diagnostic: the times of every request in the fetch slots (asked, slot taken,
                response read, slot given back), written to /tmp/slots-<pid>.txt at shutdown;
                `python -m bench.slot_report FILE...` reads them
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

ALL = ("nometrics",)  # "waits" and "slots" are diagnostics, not in "all"
IN_CORE = {
    "noevents": "CHAINCRAWL_TASK_EVENTS (default off)",
    "quietlog": "CHAINCRAWL_TASK_LOG (default off)",
    "rawpublish": "ledger.publish.Publisher",
    "commitkids": "ledger.state: the commit returns the staged children",
    "evalsha": "ledger.state.RunState.run_commits",
    "batchpublish": "ledger.publish.Publisher",
    "urllib3": "CHAINCRAWL_FETCHER (default urllib3)",
    "orjson": "broker.app.use_orjson",
    "brokerpool": "CHAINCRAWL_BROKER_MAX_CONNECTIONS",
    "lazyattrs": "external_interface.fetch.lazy",
    "batch": "CHAINCRAWL_BATCH / CHAINCRAWL_BATCH_BACKLOG",
}
log = logging.getLogger("bench.proto")


def flags(value: str | None = None) -> set[str]:
    raw = os.environ.get("BENCH_PROTO", "") if value is None else value
    out = {f.strip() for f in raw.split(",") if f.strip()}
    if "all" in out:
        out.discard("all")
        out.update(ALL)
    return out


def apply(app: Any, wanted: set[str]) -> None:
    for name in sorted(wanted):
        if name in IN_CORE:
            raise ValueError(f"BENCH_PROTO flag {name!r} is in the core now: {IN_CORE[name]}")
        fn = globals().get(f"_p_{name}")
        if fn is None:
            raise ValueError(f"unknown BENCH_PROTO flag {name!r}")
        fn(app, wanted)
    if wanted:
        log.warning("bench switches on: %s", ",".join(sorted(wanted)))


def _p_nometrics(app: Any, wanted: set[str]) -> None:
    from monitor.metrics import TaskMetrics

    def drop(self: Any, *a: Any, **kw: Any) -> None:
        self.counts.clear()

    TaskMetrics.flush = drop  # type: ignore[method-assign]
    TaskMetrics.aggregate = drop  # type: ignore[method-assign]


def _p_waits(app: Any, wanted: set[str]) -> None:
    """gevent only: count the switches into the hub (each is one wait of a greenlet) by where
    they came from, and write the table to $BENCH_WAITS_OUT (default /tmp) at shutdown."""
    import collections

    from celery import signals

    try:
        import greenlet
        from gevent.hub import Hub
    except ImportError:
        return
    counts: collections.Counter[str] = collections.Counter()

    def origin(g: Any) -> str:
        """Which greenlet waits: the main one (the consumer loop), a task, or a thread's."""
        if g.parent is None:
            return "main greenlet (consumer loop)"
        run = getattr(g, "_run", None)
        owner = getattr(run, "__self__", None)
        name = getattr(owner, "name", "") if owner is not None else ""
        args = getattr(g, "args", ()) or ()
        target = getattr(args[0], "__qualname__", "") if args and callable(args[0]) else ""
        return f"{getattr(run, '__qualname__', type(g).__name__)} {name} {target}".strip()

    def where(g: Any) -> str:
        """The waiting greenlet's innermost frames outside gevent."""
        f, keep = g.gr_frame, list[str]()
        while f is not None and len(keep) < 4:
            name = f.f_code.co_filename
            if "/gevent/" not in name:
                short = name.split("site-packages/")[-1].split("/main/")[-1]
                keep.append(f"{f.f_code.co_name}({short}:{f.f_lineno})")
            f = f.f_back
        return " < ".join(keep)

    def trace(event: str, args: Any) -> None:
        try:
            if event in ("switch", "throw") and isinstance(args[1], Hub):
                counts[origin(args[0]) + " | " + where(args[0])] += 1
        except Exception:  # a trace function must never raise into a switch
            counts["(trace error)"] += 1

    greenlet.settrace(trace)

    @signals.worker_shutdown.connect(weak=False)
    def _dump(**kw: Any) -> None:
        path = os.path.join(os.environ.get("BENCH_WAITS_OUT", "/tmp"), f"waits-{os.getpid()}.txt")
        with open(path, "w") as fh:
            fh.write(f"total {sum(counts.values())}\n")
            for k, n in counts.most_common(60):
                fh.write(f"{n:8d} {k}\n")


def _p_slots(app: Any, wanted: set[str]) -> None:
    """Diagnostic: time every request's life in the fetch slots (asked, slot taken, response
    read, slot given back, URL) and write them to $BENCH_WAITS_OUT/slots-<pid>.txt at shutdown, so
    that `bench.slot_report` can say how long a slot sits idle between two requests."""
    import threading  # its local() is greenlet-local once gevent patched threading

    from celery import signals

    from external_interface.fetch import limits as fetch_mod

    rows: list[tuple[float, float, float, float, str]] = []
    plain = fetch_mod.LimitedFetcher.fetch
    here = threading.local()

    class Inner:
        """Around the limited fetcher's inner one: the request's time inside its slot."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def fetch(self, req: Any) -> Any:
            here.took = time.monotonic()
            try:
                return self.inner.fetch(req)
            finally:
                here.done = time.monotonic()

    def timed(self: Any, req: Any) -> Any:
        if not isinstance(self.inner, Inner):
            self.inner = Inner(self.inner)
        asked, here.took = time.monotonic(), None
        try:
            return plain(self, req)  # the real path: slot, deadline, release
        finally:
            if here.took is not None:  # it got a slot
                rows.append((asked, here.took, here.done, time.monotonic(), req.url))

    fetch_mod.LimitedFetcher.fetch = timed  # type: ignore[method-assign]

    @signals.worker_shutdown.connect(weak=False)
    def _dump(**kw: Any) -> None:
        path = os.path.join(os.environ.get("BENCH_WAITS_OUT", "/tmp"), f"slots-{os.getpid()}.txt")
        with open(path, "w") as fh:
            for r in rows:
                fh.write(" ".join(f"{t:.6f}" for t in r[:4]) + f" {r[4]}\n")
