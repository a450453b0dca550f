"""demo.h5.user_info against a saved profile."""

from __future__ import annotations

from typing import cast

import pytest

from exceptions import NotFound
from sites.demo.items import User
from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_profile_fields() -> None:
    items, follows, fetcher = run("demo.h5.user_info", {"user_id": "u1"}, "h5", "user_u1.json")
    assert items == [truth.user("u1")]
    u = cast(User, items[0])
    assert (u.name, u.followers) == ("Ning Zhang 张宁", 146)
    assert follows == []
    assert fetcher.requests[0].url.endswith("/h5/api/user/u1")


def test_unknown_user_is_not_found() -> None:
    body = b'{"error":"not_found","message":"no such user u9","ok":0}'
    with pytest.raises(NotFound):
        run("demo.h5.user_info", {"user_id": "u9"}, "h5", body, status=404)
