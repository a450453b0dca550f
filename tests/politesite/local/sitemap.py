from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from external_interface.fetch.sitemap import sitemap_urls
from tests.politesite import base_url


class SitemapParams(Params):
    pass


class PageLink(Item):
    item_type: ClassVar[str] = "politesite.link"
    key_fields: ClassVar[tuple[str, ...]] = ("url",)
    store: ClassVar[bool] = False  # feeds the page step only
    url: str


@endpoint(SitemapParams, items=[PageLink], name="politesite.local.sitemap")
def sitemap(ctx: Context, p: SitemapParams) -> Outputs:
    for entry in sitemap_urls(f"{base_url()}/robots.txt", ctx.get):
        yield PageLink(url=entry.url)
