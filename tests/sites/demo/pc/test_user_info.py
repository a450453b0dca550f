"""demo.pc.user_info against saved GBK user pages."""

from __future__ import annotations

from typing import cast

import pytest

from exceptions import ParseError
from sites.demo.items import User
from tests.sites.demo import truth
from tests.sites.demo.truth import run


def test_gbk_profile_is_decoded() -> None:
    raw = truth.fixture("pc", "user_u1_page1.html").read_bytes()
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")  # really GBK bytes
    assert "张宁".encode("gbk") in raw
    items, follows, fetcher = run(
        "demo.pc.user_info", {"user_id": "u1"}, "pc", "user_u1_page1.html"
    )
    assert items == [truth.user("u1")]
    u = cast(User, items[0])
    assert (u.name, u.location, u.bio) == (
        "Ning Zhang 张宁",
        "南京 Nanjing",
        "关注教育和娱乐 | early concert fan",
    )
    assert (u.followers, u.post_count, u.verified) == (146, 3, False)
    assert follows == []
    assert fetcher.requests[0].url.endswith("/pc/user/u1")


def test_verified_user() -> None:
    items, _, _ = run("demo.pc.user_info", {"user_id": "u6"}, "pc", "user_u6_verified.html")
    assert items == [truth.user("u6", truth.SMALL)]
    assert cast(User, items[0]).verified is True


def test_not_a_user_page_raises_parse_error() -> None:
    with pytest.raises(ParseError):
        run("demo.pc.user_info", {"user_id": "u1"}, "pc", "post_p3.html")
