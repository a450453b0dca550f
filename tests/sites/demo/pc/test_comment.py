"""demo.pc.comment against saved comment pages (3 a page, 2 pages), the login wall, a ban."""

from __future__ import annotations

from typing import cast

import pytest

from exceptions import BannedError, LoginRequired
from sites.demo.items import Comment
from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_first_page_and_next_page() -> None:
    params = {"post_id": "p3", "page": 1}
    items, follows, fetcher = run("demo.pc.comment", params, "pc", "comments_p3_page1.html")
    assert items == [truth.comment(c) for c in ("c9", "c10", "c11")]
    assert cast(Comment, items[2]).text.startswith("<not a tag>")  # &lt; &gt; in the HTML
    second = cast(Comment, items[1])
    assert (second.user_id, second.user_name, second.likes) == ("u2", "Min Yang 杨敏", 303)
    assert [f.params for f in follows] == [{"post_id": "p3", "page": 2}]
    assert fetcher.requests[0].url.endswith("/pc/post/p3/comments")
    assert fetcher.requests[0].params == {"page": 1}


def test_last_page_has_no_follow_up() -> None:
    params = {"post_id": "p3", "page": 2}
    items, follows, _ = run("demo.pc.comment", params, "pc", "comments_p3_page2.html")
    assert items == [truth.comment("c12")]
    assert follows == []


def test_login_wall_is_detected_although_status_is_200() -> None:
    with pytest.raises(LoginRequired):
        run("demo.pc.comment", {"post_id": "p3"}, "pc", "login_wall.html")


def test_ban_page_raises_banned() -> None:
    with pytest.raises(BannedError):
        run("demo.pc.comment", {"post_id": "p3"}, "pc", "banned.html", status=403)
