"""Whether this process runs on gevent: what may block, and what may run side by side."""

from __future__ import annotations

import sys


def gevent_patched() -> bool:
    """True once gevent monkey-patched `threading` (the gevent pool does it at start). Asked
    without importing gevent: a threads or prefork worker never loads it."""
    monkey = sys.modules.get("gevent.monkey")
    return bool(monkey is not None and monkey.is_module_patched("threading"))
