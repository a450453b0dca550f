"""Task and message ids, and this process's id, without a system call each.

`uuid.uuid4()` reads 16 bytes from `os.urandom` and builds a UUID object for every id; a page
makes several (its children, the delivery tags of their messages). Here an id is 80 random
bits drawn once per process (and again in a forked child) followed by a 48-bit counter: 32 hex
characters like `uuid4().hex`, unique across processes and restarts with the same odds, and
never reused within a process. `pid()` is `os.getpid()` read once per process (and again in a
forked child): the per-process caches a page looks into (the runtime, the Redis clients, the
metrics aggregator, the gate) ask for it a dozen times a page.
"""

from __future__ import annotations

import itertools
import os

_state: list[object] = []
_PID = os.getpid()


def _reseed() -> None:
    global _PID
    _state[:] = [os.urandom(10).hex(), itertools.count()]
    _PID = os.getpid()


_reseed()
os.register_at_fork(after_in_child=_reseed)


def new_id() -> str:
    """A fresh 32-hex-character id (what `uuid.uuid4().hex` gives, at a fraction of the cost);
    `next` on the C counter is atomic under the GIL, so threads never share a value."""
    prefix, counter = _state
    return f"{prefix}{next(counter) & 0xFFFFFFFFFFFF:012x}"  # type: ignore[call-overload]


def pid() -> int:
    """This process's id, as `os.getpid()` (kept by a fork hook: no system call)."""
    return _PID
