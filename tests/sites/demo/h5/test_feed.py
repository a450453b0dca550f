"""demo.h5.feed against saved feed pages (2 entries a page, cursor paging)."""

from __future__ import annotations

import json
from typing import cast

import pytest

from exceptions import BannedError, ParseError
from sites.demo.items import FeedEntry
from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_first_page_follows_the_cursor() -> None:
    items, follows, fetcher = run("demo.h5.feed", {}, "h5", "feed_first.json")
    assert items == [truth.feed_entry(pid) for pid in truth.feed_ids(0, 2)]
    first = cast(FeedEntry, items[0])
    assert (first.post_id, first.user_name) == ("p6", "Min Yang 杨敏")
    cursor = json.loads(truth.fixture("h5", "feed_first.json").read_bytes())["data"]["next_cursor"]
    assert cursor and [f.params for f in follows] == [{"cursor": cursor}]
    req = fetcher.requests[0]
    assert req.url.endswith("/h5/api/feed") and req.params is None  # no cursor on page 1


def test_last_page_ends_and_sends_its_cursor() -> None:
    items, follows, fetcher = run("demo.h5.feed", {"cursor": "ZmVlZHw0"}, "h5", "feed_last.json")
    assert items == [truth.feed_entry(pid) for pid in truth.feed_ids(4, 2)]
    assert cast(FeedEntry, items[0]).title == "【游戏】Late river wins & more"
    assert follows == []
    assert fetcher.requests[0].params == {"cursor": "ZmVlZHw0"}


def test_ban_answer_raises_banned_with_its_retry_after() -> None:
    with pytest.raises(BannedError) as ei:
        run("demo.h5.feed", {}, "h5", "banned.json", status=403)
    assert ei.type is BannedError
    assert 0 < ei.value.retry_after <= 30  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "body",
    [
        b'{"ok":1,"data":{"list":[{"id":"p6"',  # cut short
        b"<html>gateway</html>",  # not JSON at all
        b'{"ok":1,"data":{"list":[]}}',  # no next_cursor
        b'{"ok":1,"data":{"list":[{"id":"p6"}],"next_cursor":null}}',  # entry lacks fields
        b'{"weird":true}',  # not the envelope
        b"[1, 2]",
    ],
)
def test_malformed_answers_raise_parse_error(body: bytes) -> None:
    with pytest.raises(ParseError):
        run("demo.h5.feed", {}, "h5", body)
