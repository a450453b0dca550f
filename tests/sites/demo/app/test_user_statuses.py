"""demo.app.user_statuses against saved pages (size 2: two pages)."""

from __future__ import annotations

from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_first_page_has_more() -> None:
    params = {"user_id": "u1", "size": 2}
    items, follows, fetcher = run("demo.app.user_statuses", params, "app", "statuses_u1_page1.json")
    assert items == [truth.status_entry("p3"), truth.status_entry("p2")]
    assert [f.params for f in follows] == [{"user_id": "u1", "page": 2, "size": 2}]
    assert fetcher.requests[0].params == {"user_id": "u1", "page": 1, "size": 2}


def test_last_page_ends() -> None:
    params = {"user_id": "u1", "page": 2, "size": 2}
    items, follows, _ = run("demo.app.user_statuses", params, "app", "statuses_u1_page2.json")
    assert items == [truth.status_entry("p1")]
    assert follows == []
