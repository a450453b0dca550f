"""demo.app.comment against saved pages (size 3: two pages) and the 401 login wall."""

from __future__ import annotations

import pytest

from exceptions import LoginRequired
from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_first_page_has_more() -> None:
    params = {"post_id": "p3", "size": 3}
    items, follows, fetcher = run("demo.app.comment", params, "app", "comments_p3_page1.json")
    assert items == [truth.comment(c) for c in ("c9", "c10", "c11")]
    assert [f.params for f in follows] == [{"post_id": "p3", "page": 2, "size": 3}]
    assert fetcher.requests[0].params == {"post_id": "p3", "page": 1, "size": 3}


def test_last_page_ends() -> None:
    params = {"post_id": "p3", "page": 2, "size": 3}
    items, follows, _ = run("demo.app.comment", params, "app", "comments_p3_page2.json")
    assert items == [truth.comment("c12")]
    assert follows == []


def test_login_required() -> None:
    with pytest.raises(LoginRequired):
        run("demo.app.comment", {"post_id": "p3"}, "app", "login_required.json", status=401)
