"""Unit tests: the data set is deterministic, lazy, consistent, and matches expected_counts."""

from __future__ import annotations

import time
from typing import cast

import pytest

from demo import captcha, signing
from demo.data import Dataset, expected_counts
from demo.paging import decode_cursor, encode_cursor, page_count


def test_same_seed_same_data_and_different_seed_differs() -> None:
    a, b, c = Dataset(7, 20, 5, 5), Dataset(7, 20, 5, 5), Dataset(8, 20, 5, 5)
    assert a.user("u3") == b.user("u3")
    assert a.post("p42") == b.post("p42")
    assert a.post_comments("p42", 0, 5) == b.post_comments("p42", 0, 5)
    assert a.feed(0, 20) == b.feed(0, 20)
    assert a.user("u3") != c.user("u3")
    assert [p.id for p in a.feed(0, 20)] != [p.id for p in c.feed(0, 20)]


def test_ids_and_bounds() -> None:
    d = Dataset(1, 5, 3, 4)
    assert d.user("u5") is not None and d.user("u6") is None
    for bad in ("u0", "u01", "x1", "u", "u-1", "p16", "c61"):
        assert d.user(bad) is None and d.post(bad) is None and d.comment(bad) is None
    assert d.post("p15").user_id == "u5"  # type: ignore[union-attr]
    assert d.comment("c60").post_id == "p15"  # type: ignore[union-attr]
    assert [c.id for c in d.post_comments("p2", 0, 10)] == ["c5", "c6", "c7", "c8"]
    assert [p.id for p in d.user_posts("u2", 0, 10)] == ["p6", "p5", "p4"]  # newest first
    assert [p.id for p in d.user_posts("u2", 1, 1)] == ["p5"]


def test_feed_is_one_newest_post_per_user_sorted_newest_first() -> None:
    d = Dataset(3, 57, 4, 1)
    feed = d.feed(0, 1000)
    assert len(feed) == 57
    assert len({p.user_id for p in feed}) == 57
    times = [p.created_at for p in feed]
    assert times == sorted(times, reverse=True) and len(set(times)) == 57
    for p in feed:
        assert p.id == d.user_posts(p.user_id, 0, 1)[0].id
    assert [p.id for p in d.feed(10, 5)] == [p.id for p in feed[10:15]]
    assert d.feed(57, 10) == []


def test_text_has_non_ascii_and_is_gbk_encodable() -> None:
    d = Dataset(42, 10, 3, 3)
    post = d.post("p1")
    user = d.user("u1")
    assert post is not None and user is not None
    assert any(ord(ch) > 127 for ch in post.content + post.title + user.name)
    for text in (post.content, post.title, user.name, user.bio, user.location):
        text.encode("gbk")  # the pc user pages are served in GBK


def test_huge_dataset_is_lazy() -> None:
    start = time.perf_counter()
    d = Dataset(1, 1_000_000, 10, 10)
    assert d.comment("c100000000") is not None
    assert len(d.feed(999_990, 20)) == 10
    assert time.perf_counter() - start < 1.0


def _front(counts: dict[str, object], name: str) -> dict[str, int]:
    """One front end's page counts: `expected_counts` types its values as object."""
    return cast(dict[str, int], counts[name])


def test_expected_counts_formulas() -> None:
    e = expected_counts(5, 3, 4)
    assert (e["users"], e["posts"], e["comments"], e["feed_entries"]) == (5, 15, 60, 5)
    assert e["pc"] == {
        "feed_pages": 1, "user_pages": 5, "post_pages": 15, "comment_pages": 15, "requests": 36,
    }  # fmt: skip
    e = expected_counts(
        21, 5, 7, pc_feed_page_size=10, pc_user_page_size=2, pc_comments_page_size=7,
        h5_feed_page_size=21, h5_statuses_page_size=5, h5_comments_page_size=3,
        app_page_size=100, app_max_size=4,
    )  # fmt: skip
    pc, h5, app = (_front(e, name) for name in ("pc", "h5", "app"))
    assert pc["feed_pages"] == 3 and pc["user_pages"] == 21 * 3
    assert pc["comment_pages"] == 105 * 1
    assert h5["feed_pages"] == 1 and h5["status_pages"] == 21
    assert h5["comment_pages"] == 105 * 3
    assert app["feed_pages"] == 6  # size clamped to 4
    assert app["status_pages"] == 21 * 2 and app["comment_pages"] == 105 * 2
    assert app["profile_requests"] == 21 and app["detail_requests"] == 105


def test_empty_lists_are_one_page() -> None:
    e = expected_counts(0, 1, 0)
    assert _front(e, "pc")["feed_pages"] == 1 and e["posts"] == 0
    e = expected_counts(3, 2, 0)
    assert e["comments"] == 0 and _front(e, "h5")["comment_pages"] == 6
    assert page_count(0, 10) == 1 and page_count(10, 10) == 1 and page_count(11, 10) == 2


def test_cursor_round_trip_and_scope() -> None:
    cur = encode_cursor("comments:p3", 40)
    assert decode_cursor(cur, "comments:p3") == 40
    with pytest.raises(ValueError):
        decode_cursor(cur, "comments:p4")
    with pytest.raises(ValueError):
        decode_cursor("!!notbase64", "feed")


def test_captcha_reference_solver_round_trips() -> None:
    for answer in ("0123", "4567", "8901", "9999", "7"):
        image = captcha.render(answer)
        rows = image.split("\n")
        assert len(rows) == 7 and {len(r) for r in rows} == {6 * len(answer) - 1}
        assert set(image) <= {"#", ".", "\n"}
        assert captcha.solve(image) == answer


def test_sign_matches_the_documented_algorithm() -> None:
    import hashlib
    import hmac

    params = {"user_id": "u1", "page": "2", "ts": "1700000000"}
    msg = "page=2&ts=1700000000&user_id=u1"
    want = hmac.new(b"demo-sign-key", msg.encode(), hashlib.sha256).hexdigest()[:32]
    assert signing.sign(params, "demo-sign-key") == want
    assert signing.sign({**params, "sign": "whatever"}, "demo-sign-key") == want
    signed = signing.signed({"user_id": "u1"}, ts=1700000000)
    assert signed["sign"] == signing.sign({"user_id": "u1", "ts": 1700000000}, "demo-sign-key")
    assert signing.verify(signed.items(), "demo-sign-key", 300, now=1700000100) is None
    assert signing.verify(signed.items(), "demo-sign-key", 300, now=1700000301) is not None
    assert signing.verify(signed.items(), "other-key", 300, now=1700000000) is not None
