"""demo.h5.detail against a saved post."""

from __future__ import annotations

from typing import cast

from sites.demo.items import Post
from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_post_fields() -> None:
    items, follows, fetcher = run("demo.h5.detail", {"post_id": "p3"}, "h5", "post_p3.json")
    assert items == [truth.post("p3")]
    post = cast(Post, items[0])
    assert post.content.startswith(post.summary + "\n")
    assert follows == []
    assert fetcher.requests[0].url.endswith("/h5/api/post/p3")
