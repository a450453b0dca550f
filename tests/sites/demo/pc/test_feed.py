"""demo.pc.feed and demo.pc.feed_index against saved feed pages (2 entries a page, 3 pages)."""

from __future__ import annotations

from typing import cast

import pytest

from exceptions import BannedError, ParseError
from sites.demo.items import FeedEntry, FeedPage
from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_first_page_entries_and_next_page() -> None:
    items, follows, fetcher = run("demo.pc.feed", {"page": 1}, "pc", "feed_page1.html")
    assert items == [truth.feed_entry(pid) for pid in truth.feed_ids(0, 2)]
    first = cast(FeedEntry, items[0])
    assert (first.post_id, first.user_id, first.user_name) == ("p6", "u2", "Min Yang 杨敏")
    assert (first.title, first.created_at, first.likes) == (
        "【天气】Late team celebrates",
        1735689600,
        22,
    )
    assert [f.params for f in follows] == [{"page": 2}]
    req = fetcher.requests[0]
    assert req.url.endswith("/pc/feed") and req.params == {"page": 1}


def test_last_page_has_no_follow_up_and_unescapes_titles() -> None:
    items, follows, _ = run("demo.pc.feed", {"page": 3}, "pc", "feed_page3.html")
    assert items == [truth.feed_entry(pid) for pid in truth.feed_ids(4, 2)]
    assert cast(FeedEntry, items[0]).title == "【游戏】Late river wins & more"  # &amp; in the HTML
    assert follows == []


def test_feed_index_shards_every_page_from_page_one() -> None:
    items, follows, fetcher = run("demo.pc.feed_index", {}, "pc", "feed_page1.html")
    assert items == [FeedPage(page=n, total_pages=3) for n in (1, 2, 3)]
    assert follows == []
    assert fetcher.requests[0].params == {"page": 1}


def test_ban_page_raises_banned() -> None:
    with pytest.raises(BannedError, match="banned for 30 s"):
        run("demo.pc.feed", {"page": 1}, "pc", "banned.html", status=403)


def test_page_cut_short_raises_parse_error() -> None:
    body = truth.fixture("pc", "feed_page1.html").read_bytes()
    with pytest.raises(ParseError):
        run("demo.pc.feed", {"page": 1}, "pc", body[: len(body) // 2])
    with pytest.raises(ParseError):
        run("demo.pc.feed_index", {}, "pc", body[: len(body) // 2])
