"""Reads a page's text (`/mislabelled`: Latin-1 labelled UTF-8), leniently or strictly."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from tests.testsite import base_url


class TextParams(Params):
    path: str


class TextResult(Item):
    item_type: ClassVar[str] = "testsite.text"
    key_fields: ClassVar[tuple[str, ...]] = ("path",)
    path: str
    title: str


@endpoint(TextParams, items=[TextResult], name="testsite.local.text", max_retries=2)
def text(ctx: Context, p: TextParams) -> Outputs:
    resp = ctx.get(f"{base_url()}{p.path}")
    yield TextResult(path=p.path, title=resp.css("p.t::text").get() or "")


@endpoint(TextParams, items=[TextResult], name="testsite.local.text_strict", max_retries=2,
          decode_errors="strict")  # fmt: skip
def text_strict(ctx: Context, p: TextParams) -> Outputs:
    resp = ctx.get(f"{base_url()}{p.path}")
    yield TextResult(path=p.path, title=resp.css("p.t::text").get() or "")
