"""Holding a run back: cancel, pause, resume, and parking a paused run's task (ledger/state.py
describes what each does to the run's keys)."""

from __future__ import annotations

import time

from ledger.records import Cancelled, Paused, Resumed, _shown
from ledger.runs import Runs


class Control(Runs):
    """Cancel, pause, resume and park: each one script on the run's slot."""

    def cancel(self, rid: str, reason: str = "") -> Cancelled:
        """Stop a run without touching the workers or other runs: its waiting children are
        dropped, its tasks in the broker are skipped as they begin, running ones send no
        children. Idempotent; a finished run is left as it is."""
        was, dropped, left = self._cancel(
            keys=[
                self.counters_key(rid),
                self.run_key(rid),
                self._active(rid),
                self.pending_key(rid),
                self.ledger_key(rid),
            ],
            args=[rid, f"{time.time():.3f}", reason[:500]],
        )
        was = was.decode() if isinstance(was, bytes) else str(was)
        if self.cluster and was == "running" and int(left) <= 0:
            # the script ended the run; its items still to store wait in its own stream
            self._ended_on_cluster([rid])
        return Cancelled(rid, was, int(dropped), max(0, int(left)))

    def pause(self, rid: str, reason: str = "") -> Paused:
        """Hold a running run (see the module docstring); idempotent."""
        status, paused, cancelled = self._pause(
            keys=[self.run_key(rid)], args=[f"{time.time():.3f}", reason[:500]]
        )
        return Paused(rid, _shown(status, paused, cancelled))

    def resume(self, rid: str, staging: str) -> Resumed:
        """Un-pause a run: what waits is moved into `staging` (up to the cap) for the caller
        to send; the rest is released by commits as usual."""
        status, paused, cancelled, moved = self._resume(
            keys=[
                self.counters_key(rid),
                self.run_key(rid),
                self.pending_key(rid),
                staging,
                self.parked_key(rid),
            ],
            args=[f"{time.time():.3f}"],
        )
        return Resumed(rid, _shown(status, paused, cancelled), int(moved))

    def park(self, rid: str, tid: str, msg: bytes, attempt: int, counted: bool) -> int:
        """Put a task of a paused run back in its waiting list instead of running it: 1 parked,
        0 not paused any more (run it), -1 committed meanwhile. `counted`: its delivery was
        counted at begin (under `attempt`) and is taken back."""
        keys = [
            self.run_key(rid),
            self.counters_key(rid),
            self.pending_key(rid),
            self.ledger_key(rid),
            self.done_key(rid, tid),
            self.deliveries_key(rid, tid, attempt),
            self.parked_key(rid),
        ]
        return int(self._park(keys=keys, args=[tid, msg, self.ttl, "1" if counted else "0"]))
