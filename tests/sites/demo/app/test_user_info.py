"""demo.app.user_info against a saved profile."""

from __future__ import annotations

from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_profile_fields() -> None:
    items, follows, fetcher = run(
        "demo.app.user_info", {"user_id": "u1"}, "app", "user_info_u1.json"
    )
    assert items == [truth.user("u1")]
    assert follows == []
    req = fetcher.requests[0]
    assert req.url.endswith("/app/api/user_info") and req.params == {"user_id": "u1"}
