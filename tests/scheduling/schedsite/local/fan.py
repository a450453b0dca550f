"""A page that fans out into `count` children without a request: the priority test's backlog."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint


class FanParams(Params):
    tag: str = ""
    count: int = 10


class FanEntry(Item):
    item_type: ClassVar[str] = "sched.fan"
    key_fields: ClassVar[tuple[str, ...]] = ("tag", "n")
    tag: str
    n: int


@endpoint(FanParams, items=[FanEntry], name="sched.local.fan")
def fan(ctx: Context, p: FanParams) -> Outputs:
    for n in range(p.count):
        yield FanEntry(tag=p.tag, n=n)
