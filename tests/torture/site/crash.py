"""`torture.local.crash`: a parser with a bug that crashes on every page it is given."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from tests.torture.site import base_url


class CrashParams(Params):
    token: str


class Never(Item):
    item_type: ClassVar[str] = "torture.never"
    key_fields: ClassVar[tuple[str, ...]] = ("token",)
    token: str


@endpoint(CrashParams, items=[Never], name="torture.local.crash", max_retries=3)
def crash(ctx: Context, p: CrashParams) -> Outputs:
    resp = ctx.get(f"{base_url()}/crash/{p.token}")
    rows = resp.css("li.row")
    per_row = len(resp.content) // len(rows)  # ZeroDivisionError: the page has no rows
    yield Never(token=f"{p.token}-{per_row}")
