"""Re-crawls that follow change: each watched key's change rate and its site's busy hours,
learned from what dedup says of every stored value, plan its next visit within a budget.

    model.py     the Poisson change model and its estimators; where the next visit goes
    watch.py     a watched set (`by_change:` of a schedule entry)
    history.py   per key and per site history, due times and the allowance, in Redis (+ .lua)
    observe.py   stored items -> visits (the outbox drainer's hook)

The trigger of a `by_change` schedule entry (scheduling/tasks.py) starts a run of the due
keys at each tick; the docs are in docs/scheduling.md ("Re-crawls that follow change").
"""

from __future__ import annotations

from typing import Any

from config import get_settings
from scheduling.recrawl.history import History, KeyRecord, Observed, Totals
from scheduling.recrawl.model import Knobs, Profile
from scheduling.recrawl.observe import Observer, WatchStores, observe_items
from scheduling.recrawl.watch import Watch
from settings.scheduling import get_recrawl_settings
from utils.clock import Clock, make_clock
from utils.keyspace import Keyspace

CLOCK_KEY = "clock"  # `<prefix>:clock`: the simulated time, with CHAINCRAWL_RECRAWL_CLOCK=redis


def recrawl_clock(client: Any) -> Clock:
    """The clock re-crawl planning reads (CHAINCRAWL_RECRAWL_CLOCK): the wall clock, or the
    simulated one in the state store that tests and benchmarks move forward."""
    name = get_recrawl_settings().clock
    if name == "redis":
        return make_clock(name, client, Keyspace(get_settings().key_prefix).key(CLOCK_KEY))
    return make_clock(name)


def observer(client: Any) -> Observer:
    """The outbox hook every worker registers (worker.py)."""
    return Observer(
        client, get_settings().key_prefix, recrawl_clock(client), get_recrawl_settings().refresh
    )


__all__ = [
    "CLOCK_KEY",
    "History",
    "KeyRecord",
    "Knobs",
    "Observed",
    "Observer",
    "Profile",
    "Totals",
    "Watch",
    "WatchStores",
    "observe_items",
    "observer",
    "recrawl_clock",
]
