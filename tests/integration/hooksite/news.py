"""Site `news`: the three hook examples of docs/hooks.md, over the demo platform's h5 API.
The blocks between `# example:` and `# end` are the documentation's code, checked equal by
tests/integration/test_hook_examples.py."""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar

from base_task import (
    Context,
    Item,
    Outputs,
    Params,
    StoredContext,
    after_store,
    before_request,
    before_store,
    endpoint,
    skip,
)


def news_url() -> str:
    return os.environ.get("NEWS_URL", "http://127.0.0.1:1")


class PostParams(Params):
    post_id: str


class NewsPost(Item):
    item_type: ClassVar[str] = "news.post"
    key_fields: ClassVar[tuple[str, ...]] = ("post_id",)
    post_id: str
    topic: str  # the business unit: 科技, 财经, 体育, ...
    title: str
    likes: int


TOPIC = re.compile(r"^【([^】]+)】")


@endpoint(PostParams, items=[NewsPost], name="news.h5.post")
def post(ctx: Context, p: PostParams) -> Outputs:
    data = ctx.get(p.post_id).json()["data"]  # the task carries the id only
    m = TOPIC.match(data["title"])
    yield NewsPost(post_id=data["id"], topic=m.group(1) if m else "", title=data["title"],
                   likes=data["likes"])  # fmt: skip


# example: complete a URL from an id
@before_request("news.h5.post")
def post_url(ctx: Context, req: Any) -> None:
    """Tasks carry only the post's id; the URL is made here, so messages stay small."""
    if "://" not in req.url:
        req.url = f"{news_url()}/h5/api/post/{req.url}"
        req.headers.setdefault("User-Agent", "Mozilla/5.0 (iPhone) Mobile")


# end


# example: drop items that break a business rule
MIN_LIKES = 20


@before_store("news.h5.post")
def popular_only(ctx: Context, item: NewsPost) -> Any:
    """Posts under MIN_LIKES likes are not kept: dropped, and counted as dropped:unpopular."""
    if item.likes < MIN_LIKES:
        return skip("unpopular")
    return None


# end


# example: count items per business unit
@after_store(site="news")
def per_topic(ctx: StoredContext, item: dict[str, Any]) -> None:
    """Every stored post counts in its topic: `topic:<topic>` in the endpoint's metrics."""
    ctx.count(f"topic:{item.get('topic') or 'none'}")


# end
