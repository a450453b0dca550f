"""The three front ends yield identical items for the same records, and the chains hold."""

from __future__ import annotations

import chains
from base_task import get_endpoint
from tests.sites.demo.truth import run

SAME = {
    "post": [
        ("demo.pc.detail", "pc", "post_p3.html"),
        ("demo.h5.detail", "h5", "post_p3.json"),
        ("demo.app.detail", "app", "detail_p3.json"),
    ],
    "user": [
        ("demo.pc.user_info", "pc", "user_u1_page1.html"),
        ("demo.h5.user_info", "h5", "user_u1.json"),
        ("demo.app.user_info", "app", "user_info_u1.json"),
    ],
    "comments": [
        ("demo.pc.comment", "pc", "comments_p3_page1.html"),
        ("demo.h5.comment", "h5", "comments_p3_first.json"),
        ("demo.app.comment", "app", "comments_p3_page1.json"),
    ],
    "feed": [
        ("demo.pc.feed", "pc", "feed_page1.html"),
        ("demo.h5.feed", "h5", "feed_first.json"),
        ("demo.app.feed", "app", "feed_page1.json"),
    ],
}
PARAMS = {"post": {"post_id": "p3"}, "user": {"user_id": "u1"}, "comments": {"post_id": "p3"}}


def test_front_ends_agree() -> None:
    for kind, sources in SAME.items():
        results = [run(t, PARAMS.get(kind, {}), plat, name)[0] for t, plat, name in sources]
        assert results[0], kind
        assert results[0] == results[1] == results[2], kind


def test_chains_cover_the_front_ends_and_dedupe_below_lists() -> None:
    social = chains.get_chain("demo_social")
    assert {get_endpoint(s.task).platform for s in social.steps.values()} == {"pc", "h5", "app"}
    for name in ("demo_social", "demo_pc_sharded", "demo_h5", "demo_app"):
        ch = chains.get_chain(name)
        assert all(s.options.unique for s in ch.steps.values() if s is not ch.root), name
    sharded = chains.get_chain("demo_pc_sharded")
    assert list(sharded.steps) == [
        "pc.feed_index", "pc.feed", "pc.user_statuses", "pc.detail", "pc.comment"
    ]  # fmt: skip
    assert sharded.steps["pc.feed"].options.max_pages == 1  # shards never walk "next" links


def test_stored_item_types_are_users_posts_comments() -> None:
    stored = {
        t.item_type
        for name in ("demo_social", "demo_pc_sharded")
        for s in chains.get_chain(name).steps.values()
        for t in get_endpoint(s.task).item_types
        if t.store
    }
    assert stored == {"demo.user", "demo.post", "demo.comment"}
