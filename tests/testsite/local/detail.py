from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from tests.testsite import base_url


class DetailParams(Params):
    entry_id: str


class Detail(Item):
    item_type: ClassVar[str] = "testsite.detail"
    key_fields: ClassVar[tuple[str, ...]] = ("entry_id",)
    entry_id: str
    title: str


@endpoint(DetailParams, items=[Detail], name="testsite.local.detail")
def detail(ctx: Context, p: DetailParams) -> Outputs:
    data = ctx.get(f"{base_url()}/detail/{p.entry_id}").json()
    yield Detail(entry_id=data["id"], title=data["title"])
