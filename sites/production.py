"""What every site's resource production shares: the parameters and items of production
endpoints, and `chain_producer`, which turns a production chain into the `Producer` a pool
starts when it runs low.

None of the items is stored: they only feed the next step, and none carries a secret (tickets
and pool ids are opaque; the secret itself waits in `external_interface.resources.vault`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import chains
from base_task import Item, Params
from config import get_settings
from external_interface.resources.pool import Producer, Seeds
from ledger.state import RunState
from utils.redis import get_redis

QUEUE = "resources"
PRIORITY = 9  # production runs go first: crawl tasks are waiting for their members


class ProduceParams(Params):
    slot: int = 0  # which member of a production batch; only makes seeds distinct


class TicketParams(Params):
    ticket: str


class Ticket(Item):
    """A vault ticket: the next step takes the secret out of Redis with it."""

    item_type: ClassVar[str] = "resource.ticket"
    key_fields: ClassVar[tuple[str, ...]] = ("ticket",)
    store: ClassVar[bool] = False
    ticket: str


class PoolEntry(Item):
    """A member that entered a pool."""

    item_type: ClassVar[str] = "resource.pool_entry"
    key_fields: ClassVar[tuple[str, ...]] = ("pool", "member")
    store: ClassVar[bool] = False
    pool: str
    member: str


def run_finished(run_id: str) -> bool:
    """Whether a chain run is over (done, its items stored, or cancelled), from the run
    ledger."""
    return RunState(get_redis(), get_settings()).status(run_id) in ("done", "cancelled")


def chain_producer(chain: chains.Chain, seeds: Callable[[int], Seeds] | None = None) -> Producer:
    """A producer that runs `chain` (at priority 9) with `seeds(n)` (default: n slots)."""

    def start(batch: list[dict[str, Any]], run_id: str) -> None:
        chains.run(chain, seeds=batch, priority=PRIORITY, run_id=run_id)

    if seeds is None:
        return Producer(chain.name, start, run_finished)
    return Producer(chain.name, start, run_finished, seeds)
