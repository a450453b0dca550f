"""demo.pc.detail against a saved post page."""

from __future__ import annotations

from typing import cast

import pytest

from exceptions import ParseError
from sites.demo.items import Post
from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_post_fields() -> None:
    items, follows, fetcher = run("demo.pc.detail", {"post_id": "p3"}, "pc", "post_p3.html")
    assert items == [truth.post("p3")]
    post = cast(Post, items[0])
    assert post.content.count("\n") == 1 and post.summary == post.content.split("\n")[0]
    assert (post.user_id, post.user_name, post.comments_count) == ("u1", "Ning Zhang 张宁", 4)
    assert follows == []
    assert fetcher.requests[0].url.endswith("/pc/post/p3")


def test_page_cut_short_raises_parse_error() -> None:
    body = truth.fixture("pc", "post_p3.html").read_bytes()
    with pytest.raises(ParseError):
        run("demo.pc.detail", {"post_id": "p3"}, "pc", body[: len(body) // 2])
