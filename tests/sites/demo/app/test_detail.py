"""demo.app.detail against a saved post."""

from __future__ import annotations

from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_post_fields() -> None:
    items, follows, fetcher = run("demo.app.detail", {"post_id": "p3"}, "app", "detail_p3.json")
    assert items == [truth.post("p3")]
    assert follows == []
    req = fetcher.requests[0]
    assert req.url.endswith("/app/api/detail") and req.params == {"post_id": "p3"}
