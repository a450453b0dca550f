"""demo.h5.detail against a saved post."""

from __future__ import annotations

from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_post_fields() -> None:
    items, follows, fetcher = run("demo.h5.detail", {"post_id": "p3"}, "h5", "post_p3.json")
    assert items == [truth.post("p3")]
    assert items[0].content.startswith(items[0].summary + "\n")
    assert follows == []
    assert fetcher.requests[0].url.endswith("/h5/api/post/p3")
