"""The `celery worker` command line, in one place: `control.sh start` (cli/procs.py) and the
benchmarks (bench/chaincrawl_bench.py) start workers the same way, so a benchmark measures
the workers operators run."""

from __future__ import annotations

import sys
from collections.abc import Sequence

HEARTBEAT_INTERVAL = 10  # seconds between two worker-heartbeat events (Celery's default: 2)
READY_MARKER = " ready."  # what a Celery worker logs at INFO once it consumes


def worker_argv(
    *,
    app: str,
    pool: str,
    concurrency: int,
    queues: str,
    node: str,
    events: bool,
    extra: Sequence[str] = (),
) -> list[str]:
    """`python -m celery -A <app> worker`: `pool` (-P), `concurrency` (-c), `queues` (-Q, comma
    separated), `node` (-n, "<name>@%h"), task events (-E, for Flower's task list) only when
    `events`, INFO logs (the readiness wait reads " ready." in them), no gossip or mingle between
    workers, a heartbeat event every `HEARTBEAT_INTERVAL` s; `extra` flags last."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app,
        "worker",
        "-P",
        pool,
        "-c",
        str(concurrency),
        "-Q",
        queues,
        "-n",
        node,
        *(["-E"] if events else []),
        "-l",
        "INFO",
        "--without-gossip",
        # mingle asks the other workers for their revoked task ids at start (chaincrawl cancels
        # runs in Redis, not by revoke) and waits a second for answers: a start without it
        "--without-mingle",
        # Flower's worker list reads these events; an idle worker published one every 2 s
        # (Celery's default), Flower counts a worker offline after two intervals without one
        "--heartbeat-interval",
        str(HEARTBEAT_INTERVAL),
        *extra,
    ]
