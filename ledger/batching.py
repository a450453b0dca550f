"""How many pages go in one broker message: the batching heuristics of the publisher.

A message costs its consumer about 1-3 ms of CPU whatever it carries, so a deep backlog is sent
as batches (`chaincrawl.batch` messages of up to `CHAINCRAWL_BATCH` pages). A shallow one is
not: every worker slot needs a message of its own to stay busy, and where a batch runs its pages
one after the other (threads, prefork) k pages in one slot cost k latencies. `Load` is what the
heuristics read of the process: its slots, how busy its CPU is, and whether a batch's pages run
side by side (gevent). docs/performance.md has the measurements behind the constants.
"""

from __future__ import annotations

from collections.abc import Callable

from config import Settings
from utils.cpuload import CpuMeter
from utils.greenlets import gevent_patched

BATCH_TASK = "chaincrawl.batch"  # args = [entries], each entry a `Kid.encode()` dict

# threads/prefork: below this share of a core wanted, one page per message. The CPU is to
# spare then, and a batch runs its pages one after the other in one slot (k pages = k
# latencies), which left slots idle in the tail of a latency-bound run. Not lower: a
# latency-bound crawl parses its 16 responses together every 250 ms, and on the threads pool
# one 0.1 s window read 0.5-0.6; batched then, a user's ten posts ran one after the other in
# one slot and made a 2.5 s tail. A CPU-bound crawl reads 0.95 and more from its first 20 ms.
# (Smoothing the share over windows instead delayed the first batches of a CPU-bound crawl and
# cost it 30 % CPU per page: the first publishes decide whether their subtrees run batched.)
BATCH_CPU_MIN = 0.75
# gevent: one publish's children of one destination go in at most this many messages
# (`Publisher.plan`), however shallow the backlog. Their pages run side by side, so a batch
# costs no latency, while a message costs its consumer ~1-3 ms of CPU. Four, not one: a second
# worker (a second core, in a CPU-bound crawl) still gets its share of a small fan-out.
FANOUT_MESSAGES = 4
BATCH_SLOT_FACTOR = 2  # messages per worker slot the backlog must still make when batched
BATCH_CPU_BOUND = 0.85  # share of a core wanted recently from which the worker is CPU-bound
CPU_WINDOW = 0.1  # seconds over which `Load.busy` measures
DEFAULT_SLOTS = 16  # a process that is not a worker (a client, a test) sizes for this


class Load:
    """The process as batching sees it. Workers size it at start (`slots`: the pool's
    concurrency); every page ticks `busy()` so it is fresh whenever a publish asks (asked only
    by publishes, it went stale between the few pages with children, read 0 on a CPU-bound
    crawl and left it at one page per message: 3.3 ms instead of 1.4 per page)."""

    def __init__(
        self,
        slots: int = 0,
        busy: Callable[[], float] | None = None,
        side_by_side: Callable[[], bool] = gevent_patched,
    ) -> None:
        self.slots = max(1, int(slots)) if slots else DEFAULT_SLOTS
        self._meter = CpuMeter(CPU_WINDOW)
        self.busy: Callable[[], float] = busy or self._meter.demand
        self.side_by_side = side_by_side

    def tail_backlog(self) -> int:
        """Below this many outstanding tasks a run is in its tail: tasks write the pending
        metrics with their commit, so a finished run's metrics are complete."""
        return max(64, 2 * self.slots)


def batch_size(s: Settings, outstanding: int, load: Load, cpu_floor: bool = True) -> int:
    """Pages per message for children of a run with `outstanding` tasks.

    With `CHAINCRAWL_BATCH_BACKLOG` set: `batch` from that backlog on, else 1. Auto (0): the
    backlog must still make enough messages to keep the worker busy — two per slot (every slot
    needs work; ramp-up and tail stay one page per message; a second worker gets its share), a
    quarter of that (at least 4) once it is CPU-bound (more messages would not add throughput,
    only per-message cost).

    Where a batch runs its pages one after the other (threads, prefork), also one page per
    message while the worker wants less than 3/4 of a core (latency-bound: the CPU is to spare,
    and k pages in one slot cost k latencies; skipped with `cpu_floor=False`). Under gevent a
    batch runs its pages side by side, so latency-bound workers batch too, and slots beyond
    2 x `batch` count no further (one message keeps up to `batch` of them busy)."""
    size = max(1, s.batch)
    if size == 1:
        return 1
    if s.batch_backlog > 0:
        return size if outstanding >= s.batch_backlog else 1
    busy = load.busy()
    side_by_side = load.side_by_side()
    if cpu_floor and busy < BATCH_CPU_MIN and not side_by_side:
        return 1
    slots = load.slots
    if side_by_side:  # one message can keep up to `batch` slots busy
        slots = min(slots, BATCH_SLOT_FACTOR * size)
    wanted = BATCH_SLOT_FACTOR * slots
    if busy >= BATCH_CPU_BOUND:
        wanted = max(4, wanted // 4)
    return max(1, min(size, outstanding // wanted))
