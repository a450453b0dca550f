"""A worker whose broker connection dropped while it was alive may have lost a message: Redis
popped it for the worker's BRPOP and the reply never arrived (bug 1 without a death; a network
blip between machines, a proxy's idle cut). Neither a death nor a restart of the broker shows
it, so until now only the stall rule found it, `CHAINCRAWL_SWEEP_STALL` after the run's last
commit. Celery reconnects through `Consumer.on_connection_error_after_connected`; `apply()`
wraps it to note the drop, and the process's sweeper thread hands the note to whichever process
sweeps next (`Sweeper.note_connection_drops`): that pass checks every active run's ledger.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

_lock = threading.Lock()
_pending: list[str] = []  # why, one per drop not yet handed to the sweepers
_applied = False


def note(why: str) -> None:
    with _lock:
        if len(_pending) < 100:
            _pending.append(why)


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

    def on_connection_error_after_connected(self: Any, exc: BaseException) -> Any:
        note(f"{socket.gethostname()}: the broker connection dropped ({type(exc).__name__})")
        return original(self, exc)

    Consumer.on_connection_error_after_connected = on_connection_error_after_connected
    _applied = True
