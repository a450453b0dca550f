"""demo.app.feed against saved feed pages (size 2: three pages)."""

from __future__ import annotations

import pytest

from exceptions import BannedError, Forbidden, ParseError
from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_first_page_has_more() -> None:
    items, follows, fetcher = run("demo.app.feed", {"size": 2}, "app", "feed_page1.json")
    assert items == [truth.feed_entry(pid) for pid in truth.feed_ids(0, 2)]
    assert [f.params for f in follows] == [{"page": 2, "size": 2}]
    req = fetcher.requests[0]
    assert req.url.endswith("/app/api/feed") and req.params == {"page": 1, "size": 2}


def test_last_page_ends() -> None:
    items, follows, _ = run("demo.app.feed", {"page": 3, "size": 2}, "app", "feed_page3.json")
    assert items == [truth.feed_entry(pid) for pid in truth.feed_ids(4, 2)]
    assert follows == []


def test_banned() -> None:
    with pytest.raises(BannedError) as ei:
        run("demo.app.feed", {}, "app", "banned.json", status=403)
    assert ei.type is BannedError


def test_other_refusals_are_forbidden() -> None:
    body = b'{"error":"bad_sign","message":"signature mismatch","code":403}'
    with pytest.raises(Forbidden):
        run("demo.app.feed", {}, "app", body, status=403)


def test_error_envelope_with_200_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        run("demo.app.feed", {}, "app", b'{"code":1,"msg":"oops"}')
