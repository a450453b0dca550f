"""CPU affinity for a whole benchmark stack: this process and every process it started.

The scale scenario's "x1 on 1 core" / "x2 on 2 cores" rows give n workers n cores for
everything (workers, redis-server, page server, driver), so the ratio measures what another
core and worker add, not the free core that redis and the page server get next to one worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import psutil

from utils.affinity import allowed, pin_threads, supported

__all__ = ["allowed", "pin_tree", "pinned", "supported"]


def pin_tree(cpus: Iterable[int]) -> None:
    """Pin every thread of this process and of its descendants to `cpus`."""
    mask = set(cpus)
    for p in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        pin_threads(p.pid, mask)


@contextlib.contextmanager
def pinned(n: int) -> Iterator[None]:
    """The stack on the first `n` allowed cores for the block, on all allowed ones after."""
    cores = allowed()
    if n > len(cores):
        raise ValueError(f"cannot pin to {n} cores: only {len(cores)} allowed ({cores})")
    pin_tree(cores[:n])
    try:
        yield
    finally:
        pin_tree(cores)
