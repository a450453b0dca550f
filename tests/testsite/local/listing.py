from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from tests.testsite import base_url


class ListingParams(Params):
    page: int = 1
    per: int | None = None  # entries per page (the site's default: PER_PAGE)


class Entry(Item):
    item_type: ClassVar[str] = "testsite.entry"
    key_fields: ClassVar[tuple[str, ...]] = ("entry_id",)
    entry_id: str
    n: int


@endpoint(ListingParams, items=[Entry], name="testsite.local.listing")
def listing(ctx: Context, p: ListingParams) -> Outputs:
    data = ctx.get(f"{base_url()}/list", params={"page": p.page, "per": p.per}).json()
    for e in data["entries"]:
        yield Entry(entry_id=e["id"], n=e["n"])
    if data["next"]:
        yield ctx.follow(page=data["next"])
