"""A page that never gets its resource: raises `ResourceUnavailable` every time (as an empty
cookie pool that nobody refills would)."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from exceptions import ResourceUnavailable


class StarvedParams(Params):
    entry_id: str


class Never(Item):
    item_type: ClassVar[str] = "testsite.never"
    key_fields: ClassVar[tuple[str, ...]] = ("entry_id",)
    entry_id: str


@endpoint(StarvedParams, items=[Never], name="testsite.local.starved")
def starved(ctx: Context, p: StarvedParams) -> Outputs:
    raise ResourceUnavailable(f"no cookie free for {p.entry_id} (test)", retry_after=0.2)
    yield Never(entry_id=p.entry_id)  # not reached
