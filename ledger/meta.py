"""What a task message carries besides its parameters: its run, step, priority and retry state.

Code reads and writes it as a `TaskMeta` with readable names; the message carries the compact
wire form (a JSON object with short keys, below), because every page's message, ledger entry
and staged child holds one, and the ledger's Lua scripts read `step` from it.

    wire key    field         meaning
    run         run_id        the run the task belongs to ("" = a task sent outside a run)
    step        step          the chain step that dispatched it (counters are kept per step)
    prio        priority      0..9, 9 most urgent (the run's, or the step's override)
    page        page          1 for a step's first task, n for its (n-1)th follow-up
    queue       queue         the step's queue override ("" = the site's queue)
    dd          dedup_id      the request's dedup id, marked once the task has committed
    rbase       retry_base    retries already used before the task was parked (a paused run)
    waits       waits         re-queues spent waiting for a resource or a shared limit
    wait_since  wait_since    when it started waiting (unix time) for `resource_wait_max`
    avoid       avoid         resource leases that failed it ("kind:id"): a retry skips them
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RUN, STEP, PRIORITY, PAGE, QUEUE = "run", "step", "prio", "page", "queue"
DEDUP, RETRY_BASE, WAITS, WAIT_SINCE, AVOID = "dd", "rbase", "waits", "wait_since", "avoid"

AVOID_KEEP = 32  # leases a message remembers to avoid (the newest)


@dataclass(slots=True)
class TaskMeta:
    run_id: str = ""
    step: str = ""
    priority: int | None = None
    page: int = 1
    queue: str = ""
    dedup_id: str = ""
    retry_base: int = 0
    waits: int = 0
    wait_since: float | None = None
    avoid: tuple[str, ...] = ()

    @classmethod
    def from_wire(cls, d: Mapping[str, Any] | None) -> TaskMeta:
        """Tolerant of what a hand-made or old message may lack; a malformed priority is
        dropped (the default applies) rather than failing the page."""
        if not d:
            return cls()
        prio = d.get(PRIORITY)
        try:
            prio = None if prio is None else int(prio)
        except (TypeError, ValueError):
            prio = None
        since = d.get(WAIT_SINCE)
        return cls(
            run_id=str(d.get(RUN) or ""),
            step=str(d.get(STEP) or ""),
            priority=prio,
            page=int(d.get(PAGE) or 1),
            queue=str(d.get(QUEUE) or ""),
            dedup_id=str(d.get(DEDUP) or ""),
            retry_base=int(d.get(RETRY_BASE) or 0),
            waits=int(d.get(WAITS) or 0),
            wait_since=float(since) if since else None,
            avoid=tuple(d.get(AVOID) or ()),
        )

    def to_wire(self) -> dict[str, Any]:
        """The compact form, with unset fields left out (as the messages always were)."""
        d: dict[str, Any] = {}
        if self.run_id:
            d[RUN] = self.run_id
        if self.step:
            d[STEP] = self.step
        if self.priority is not None:
            d[PRIORITY] = self.priority
        if self.page != 1:
            d[PAGE] = self.page
        if self.queue:
            d[QUEUE] = self.queue
        if self.dedup_id:
            d[DEDUP] = self.dedup_id
        if self.retry_base:
            d[RETRY_BASE] = self.retry_base
        if self.waits:
            d[WAITS] = self.waits
        if self.wait_since is not None:
            d[WAIT_SINCE] = self.wait_since
        if self.avoid:
            d[AVOID] = list(self.avoid)
        return d

    def child(self, step: str, page: int = 1) -> TaskMeta:
        """A child's metadata: its run and priority kept, everything per-attempt reset."""
        return TaskMeta(run_id=self.run_id, step=step, priority=self.priority, page=page)
