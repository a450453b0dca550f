"""Rows of any page (`li.row`), by full URL: a page whose selector matches nothing yields
nothing, counted `empty`, or failed as `EmptyPage` by the `must_yield` variant."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint


class RowsParams(Params):
    url: str


class Row(Item):
    item_type: ClassVar[str] = "testsite.row"
    key_fields: ClassVar[tuple[str, ...]] = ("url", "text")
    url: str
    text: str


def _rows(ctx: Context, p: RowsParams) -> Outputs:
    resp = ctx.get(p.url)
    for row in resp.css("li.row::text").getall():
        yield Row(url=p.url, text=row)


@endpoint(RowsParams, items=[Row], name="testsite.local.rows", max_retries=1)
def rows(ctx: Context, p: RowsParams) -> Outputs:
    yield from _rows(ctx, p)


@endpoint(RowsParams, items=[Row], name="testsite.local.rows_must", max_retries=1,
          must_yield=True)  # fmt: skip
def rows_must(ctx: Context, p: RowsParams) -> Outputs:
    yield from _rows(ctx, p)
