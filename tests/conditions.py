"""Waiting on a condition, not on time: what a test polls until it holds (or gives up)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(cond: Callable[[], Any], timeout: float, what: str, poll: float = 0.1) -> Any:
    """`cond()`'s first truthy value, polled every `poll` seconds; TimeoutError naming `what`
    past `timeout` (generous: the machine is shared)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(poll)
    raise TimeoutError(f"{what}: not within {timeout}s")
