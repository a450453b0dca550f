"""demo.h5.comment against saved comment pages (3 a page), the 401 login wall, a ban."""

from __future__ import annotations

import json
from typing import cast

import pytest

from exceptions import BannedError, LoginRequired
from sites.demo.items import Comment
from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_first_page_follows_the_cursor() -> None:
    items, follows, _ = run("demo.h5.comment", {"post_id": "p3"}, "h5", "comments_p3_first.json")
    assert items == [truth.comment(c) for c in ("c9", "c10", "c11")]
    assert cast(Comment, items[2]).text.startswith("<not a tag>")
    body = json.loads(truth.fixture("h5", "comments_p3_first.json").read_bytes())
    assert [f.params for f in follows] == [{"post_id": "p3", "cursor": body["data"]["next_cursor"]}]


def test_last_page_has_no_follow_up() -> None:
    params = {"post_id": "p3", "cursor": "Y29tbWVudHM6cDN8Mw"}
    items, follows, fetcher = run("demo.h5.comment", params, "h5", "comments_p3_last.json")
    assert items == [truth.comment("c12")]
    assert follows == []
    assert fetcher.requests[0].url.endswith("/h5/api/post/p3/comments")


def test_login_required() -> None:
    with pytest.raises(LoginRequired):
        run("demo.h5.comment", {"post_id": "p3"}, "h5", "login_required.json", status=401)


def test_banned() -> None:
    with pytest.raises(BannedError) as ei:
        run("demo.h5.comment", {"post_id": "p3"}, "h5", "banned.json", status=403)
    assert ei.type is BannedError
