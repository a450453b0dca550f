"""Parameters and items shared by production endpoints. None of them is stored: they only
feed the next step, and none carries a secret (tickets and pool ids are opaque)."""

from __future__ import annotations

from typing import ClassVar

from base_task import Item, Params

QUEUE = "resources"


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
