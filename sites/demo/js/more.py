"""demo js: the whole feed behind a "load more" button, `/js/more`, read from the page's own
API answers (`/js/api/feed`) captured while the button is clicked until it is gone."""

from __future__ import annotations

from typing import Any

from base_task import Context, Outputs, Params, ParseError, endpoint, need
from external_interface.browser import LoadMore
from sites.demo.items import FeedEntry
from sites.demo.js import FEED_SETTLED, render


class MoreParams(Params):
    pass


@endpoint(MoreParams, items=[FeedEntry], resources=["browser", "user_agent"])
def more(ctx: Context, p: MoreParams) -> Outputs:
    page = render(
        ctx,
        "/js/more",
        FEED_SETTLED,
        actions=[LoadMore("button.load-more", item=".feed-item")],
        capture_json=r"/js/api/feed\?",
    )
    need(page, "p.feed-end::text")  # shown once the last batch is in
    entries: dict[str, dict[str, Any]] = {}
    total = None
    for answer in page.captured:
        try:
            data = answer.json() if answer.status == 200 else None
        except ParseError:
            data = None  # an answer cut short: the entries must come from the others
        if not isinstance(data, dict) or not isinstance(data.get("list"), list):
            continue
        total = data.get("total")
        for entry in data["list"]:
            entries.setdefault(entry["id"], entry)
    drawn = len(page.css(".feed-item"))
    if total is None or len(entries) != total or drawn != total:
        raise ParseError(
            f"{page.url}: {len(entries)} entries answered, {drawn} drawn, {total} in the feed"
        )
    for entry in entries.values():
        yield FeedEntry.from_api(entry)
