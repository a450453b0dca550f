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
"""

from __future__ import annotations

import logging
import os
from typing import Any

ALL = ("nometrics",)
IN_CORE = {
    "noevents": "CHAINCRAWL_TASK_EVENTS (default off)",
    "quietlog": "CHAINCRAWL_TASK_LOG (default off)",
    "rawpublish": "base_task.Publisher",
    "commitkids": "chains.state: the commit returns the staged children",
    "evalsha": "chains.state.RunState.run_commits",
    "batchpublish": "base_task.Publisher",
    "urllib3": "CHAINCRAWL_FETCHER (default urllib3)",
    "orjson": "worker.use_orjson",
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
