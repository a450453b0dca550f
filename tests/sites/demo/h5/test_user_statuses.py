"""demo.h5.user_statuses against saved status pages (2 a page, cursor paging)."""

from __future__ import annotations

import json

from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_first_page_follows_the_cursor() -> None:
    params = {"user_id": "u1"}
    items, follows, fetcher = run("demo.h5.user_statuses", params, "h5", "statuses_u1_first.json")
    assert items == [truth.status_entry("p3"), truth.status_entry("p2")]
    body = json.loads(truth.fixture("h5", "statuses_u1_first.json").read_bytes())
    assert [f.params for f in follows] == [{"user_id": "u1", "cursor": body["data"]["next_cursor"]}]
    assert fetcher.requests[0].url.endswith("/h5/api/user/u1/statuses")


def test_last_page_has_no_follow_up() -> None:
    params = {"user_id": "u1", "cursor": "c3RhdHVzZXM6dTF8Mg"}
    items, follows, fetcher = run("demo.h5.user_statuses", params, "h5", "statuses_u1_last.json")
    assert items == [truth.status_entry("p1")]
    assert follows == []
    assert fetcher.requests[0].params == {"cursor": "c3RhdHVzZXM6dTF8Mg"}
