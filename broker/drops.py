"""A worker whose broker connection dropped while it was alive may have lost a message: Redis
popped it for the worker's BRPOP and the reply never arrived (a message lost without a death; a network
blip between machines, a proxy's idle cut). Neither a death nor a restart of the broker shows
it, so until now only the stall rule found it, `CHAINCRAWL_SWEEP_STALL` after the run's last
commit. Celery reconnects through `Consumer.on_connection_error_after_connected`; `apply()`
wraps it to note the drop, and the process's sweeper thread hands the note to whichever process
sweeps next (`Sweeper.note_connection_drops`): that pass checks every active run's ledger.

The drop also voids what the worker held: a message taken before it can no longer be acked or
rejected for sure (a task's reject while Redis was down failed for good, and kombu's restore
of the old channel's messages on close needed Redis too), so it would sit in `unacked` until
the visibility timeout while the run waits. `dropped_before()` gives the process's sweeper the
time of the drop (`Sweeper.restore_held_before_drop`).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

_lock = threading.Lock()
_pending: list[str] = []  # why, one per drop not yet handed to the sweepers
_dropped_at: list[float] = []  # time.time() of drops whose held messages are not given back
_applied = False


def note(why: str, at: float | None = None) -> None:
    with _lock:
        if len(_pending) < 100:
            _pending.append(why)
        _dropped_at.append(time.time() if at is None else at)
        del _dropped_at[:-1]  # the latest: everything taken before it is void


def dropped_before(now: float, grace: float) -> float | None:
    """The time of the last drop if it is at least `grace` s old (tasks still running then
    have had time to ack through the new connection), and forget it; else None."""
    with _lock:
        if not _dropped_at or now - _dropped_at[-1] < grace:
            return None
        return _dropped_at.pop()


def put_back_drop(at: float) -> None:
    """A drop whose messages could not be given back yet (Redis down again): next time."""
    with _lock:
        if not _dropped_at:
            _dropped_at.append(at)


def noted() -> bool:
    """A drop not yet handed on to the sweepers (what it held, if anything, is unacknowledged:
    the sweeper's passes see that as work)."""
    with _lock:
        return bool(_pending)


def take() -> list[str]:
    """The drops noted since the last call (and forget them)."""
    with _lock:
        out = list(_pending)
        _pending.clear()
        return out


def put_back(whys: list[str]) -> None:
    """Drops that could not be handed on (the state store is down too): next time."""
    for why in whys:
        note(why)


def apply() -> None:
    """Wrap Celery's consumer hook once; fails loudly if Celery no longer has it."""
    global _applied
    from celery.worker.consumer.consumer import Consumer

    if _applied:
        return
    original = Consumer.on_connection_error_after_connected

    def on_connection_error_after_connected(self: Any, exc: Exception) -> Any:
        note(f"{socket.gethostname()}: the broker connection dropped ({type(exc).__name__})")
        return original(self, exc)

    Consumer.on_connection_error_after_connected = on_connection_error_after_connected  # type: ignore[method-assign]
    _applied = True
