"""`torture.local.hostile`: items whose field names come from page content (`$where`, `a.b`)."""

from __future__ import annotations

from typing import Any, ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from tests.torture.site import base_url


class HostileParams(Params):
    hid: str


class Hostile(Item):
    item_type: ClassVar[str] = "torture.hostile"
    key_fields: ClassVar[tuple[str, ...]] = ("hid",)
    hid: str
    attrs: dict[str, Any]
    tags: list[Any]


@endpoint(HostileParams, items=[Hostile], name="torture.local.hostile", max_retries=1)
def hostile(ctx: Context, p: HostileParams) -> Outputs:
    data = ctx.get(f"{base_url()}/hostile", params={"hid": p.hid}).json()
    yield Hostile(hid=data["hid"], attrs=data["attrs"], tags=data["tags"])
