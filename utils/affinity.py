"""One core per threads-pool worker: the GIL makes cross-core hand-offs the pool's main cost.

A threads-pool worker runs Python on one core at a time anyway (the GIL), but the kernel
spreads its threads over every core, and each of the thousands of GIL hand-offs per second
(every lxml call and socket operation releases it) then wakes a thread on the other core:
measured on 2 cores, 1.15-1.21 ms of CPU per page unpinned against 0.63-0.66 pinned, and
1.5-1.6x the pages/s (docs/performance.md). So `control.sh start` pins worker n of a host to
allowed core (n-1) mod cores: one worker process per core, as the GIL wants.

`CHAINCRAWL_PIN_CORES`: `auto` pins the threads pool only (gevent and solo run one OS thread,
which the kernel already keeps on a core; measured no gain), `on` pins gevent and solo too,
`off` never. prefork is never pinned: its children are its concurrency across cores.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable

PINNABLE = {"auto": ("threads",), "on": ("threads", "gevent", "solo"), "off": ()}


def supported() -> bool:
    return hasattr(os, "sched_setaffinity")


def allowed() -> list[int]:
    """The cores this process may run on (all of them unless started under taskset/cpuset)."""
    return sorted(os.sched_getaffinity(0))


def worker_index(nodename: str) -> int | None:
    """n of `w<n>@host` (the digits just before the `@`); None when there are none."""
    m = re.search(r"(\d+)@", nodename or "")
    return int(m.group(1)) if m else None


def core_for(mode: str, pool: str, nodename: str, cores: list[int]) -> int | None:
    """The core worker `nodename` is pinned to, or None to leave it to the kernel."""
    if mode not in PINNABLE:
        raise ValueError(f"CHAINCRAWL_PIN_CORES must be one of {', '.join(PINNABLE)}, not {mode!r}")
    if pool not in PINNABLE[mode] or not cores:
        return None
    n = worker_index(nodename)
    if n is None or n < 1:
        return None
    return cores[(n - 1) % len(cores)]


def pin_threads(pid: int, cpus: Iterable[int]) -> None:
    """Pin every thread of process `pid` to `cpus` (sched_setaffinity moves one thread only;
    threads started later inherit the mask of the thread that starts them)."""
    mask = set(cpus)
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, mask)
