"""demo.pc.user_statuses against saved GBK user pages (2 posts a page, 2 pages)."""

from __future__ import annotations

from sites.demo.items import StatusEntry
from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_first_page_yields_the_user_and_newest_posts() -> None:
    params = {"user_id": "u1", "page": 1}
    items, follows, fetcher = run("demo.pc.user_statuses", params, "pc", "user_u1_page1.html")
    assert items == [truth.user("u1"), truth.status_entry("p3"), truth.status_entry("p2")]
    assert items[1] == StatusEntry(
        post_id="p3",
        user_id="u1",
        title="【电影】Local team slows",
        likes=11,
        created_at=1735688400,
    )
    assert [f.params for f in follows] == [{"user_id": "u1", "page": 2}]
    assert fetcher.requests[0].params == {"page": 1}


def test_last_page_has_posts_only_and_no_follow_up() -> None:
    params = {"user_id": "u1", "page": 2}
    items, follows, _ = run("demo.pc.user_statuses", params, "pc", "user_u1_page2.html")
    assert items == [truth.status_entry("p1")]  # the user was stored from page 1
    assert follows == []
