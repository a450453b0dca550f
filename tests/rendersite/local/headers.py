"""Render the demo's `/headers` echo and store what the site saw of the browser: its address
(the lent proxy's), its user agent and its cookies (the lent session's)."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint


class HeadersParams(Params):
    url: str
    n: int = 0  # one task per n: the same page asked several times


class Seen(Item):
    item_type: ClassVar[str] = "rendersite.seen"
    key_fields: ClassVar[tuple[str, ...]] = ("n",)
    n: int
    remote_addr: str
    user_agent: str
    cookie: str


@endpoint(HeadersParams, items=[Seen], name="rendersite.local.headers", max_retries=4,
          resources=["browser", "cookie", "user_agent"])  # fmt: skip
def headers(ctx: Context, p: HeadersParams) -> Outputs:
    page = ctx.render(p.url, capture_json=r"/headers$")
    (echo,) = page.json_answers()  # the document itself, as the site answered it
    yield Seen(
        n=p.n,
        remote_addr=echo["remote_addr"],
        user_agent=echo["headers"].get("User-Agent", ""),
        cookie=echo["headers"].get("Cookie", ""),
    )
