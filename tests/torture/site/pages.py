"""`torture.local.page`: fetch one path and read it as HTML, JSON or text.

The parsing is what a real endpoint does: a required CSS match (`p.t`), a JSON object with a
`value`, or the decoded text. Anything else is a ParseError (retried, then dead-lettered).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from base_task import Context, Item, Outputs, Params, endpoint
from exceptions import ParseError
from tests.torture.site import base_url


class PageParams(Params):
    path: str
    kind: Literal["html", "json", "text", "badout"] = "html"


class Page(Item):
    item_type: ClassVar[str] = "torture.page"
    key_fields: ClassVar[tuple[str, ...]] = ("path",)
    path: str
    text: str
    encoding: str


@endpoint(PageParams, items=[Page], name="torture.local.page", max_retries=2)
def page(ctx: Context, p: PageParams) -> Outputs:
    resp = ctx.get(base_url() + p.path)
    if p.kind == "json":
        data = resp.json()  # ParseError on anything orjson refuses
        if not isinstance(data, dict) or "value" not in data:
            raise ParseError(f"{p.path}: expected an object with 'value', got {str(data)[:80]}")
        text = str(data["value"])
    elif p.kind == "html":
        found = resp.css("p.t::text").get()
        if found is None:
            raise ParseError(f"{p.path}: no p.t on the page")
        text = found
    elif p.kind == "badout":
        yield Page(path=p.path, text=None, encoding=resp.encoding)
        return
    else:
        text = resp.text
    yield Page(path=p.path, text=text[:2000], encoding=resp.encoding)
