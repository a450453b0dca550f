"""The demo's pc markup, parsed once: the pc pages serve it, and the js front end's script
draws the same markup into its pages (demo/README.md, sections 4 and 4a)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from base_task import Context, Follow, need, need_int
from sites.demo.items import FeedEntry, Post


def feed_entries(page: Any) -> Iterator[FeedEntry]:
    """The `.feed-item` entries of a feed section, in page order."""
    for row in page.css("section.feed .feed-item"):
        yield FeedEntry(
            post_id=need(row, "::attr(data-pid)"),
            user_id=need(row, "::attr(data-uid)"),
            user_name=need(row, "a.user-link::text"),
            title=need(row, "a.post-link::text"),
            summary=row.css("p.summary::text").get(""),
            likes=need_int(row, ".likes::text"),
            comments_count=need_int(row, ".comments-count::text"),
            created_at=need_int(row, "time.created-at::attr(data-ts)"),
        )


def feed_page(ctx: Context, resp: Any, page: int) -> Iterator[FeedEntry | Follow]:
    """A pc feed page's entries and, when it has a next page, the follow-up to it."""
    need(resp, ".pager .total-pages::text")  # the last element: the page arrived whole
    yield from feed_entries(resp)
    if resp.css(".pager a.next"):
        yield ctx.follow(page=page + 1)


def post_detail(page: Any) -> Post:
    """The post of an `article.post-detail`; its paragraphs joined by newlines are the API's
    content."""
    art = page.css("article.post-detail")
    need(art, "a.comments-link::attr(href)")  # the article's last element: it arrived whole
    paragraphs = art.css(".post-content p::text").getall()
    return Post(
        post_id=need(art, "::attr(data-pid)"),
        user_id=need(art, "::attr(data-uid)"),
        user_name=need(art, ".meta a.user-link::text"),
        title=need(art, "h1.title::text"),
        summary=paragraphs[0] if paragraphs else "",
        content="\n".join(paragraphs),
        likes=need_int(art, ".meta .likes::text"),
        comments_count=need_int(art, ".meta .comments-count::text"),
        created_at=need_int(art, ".meta time.created-at::attr(data-ts)"),
    )
