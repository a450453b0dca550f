"""Chains over the local demo platform (sites/demo): the seed's business chain and friends.

demo_social — the social platform's business chain, spread over all three front ends:

    h5.feed ─┬─> h5.user_info                                   (demo.user)
             └─> h5.user_statuses ─> app.detail ─> pc.comment   (demo.post, demo.comment)

demo_pc_sharded — pc only; the feed index is sharded: page 1 tells the page count,
so every index page is dispatched at once instead of walking "next" links one by one. The pc
user page carries the profile, so user_statuses stores the users too:

    pc.feed_index ─> pc.feed (one task per page) ─> pc.user_statuses ─> pc.detail ─> pc.comment

demo_h5, demo_app — the same business chain on one front end each.

demo_js — the business chain from a list rendered in a browser: the js front end's "load
more" page is rendered until the button is gone (its entries read from the page's own API
answers), and plain API and HTML steps do the rest. Stores exactly what demo_social stores:

    js.more ─┬─> h5.user_info                                   (demo.user)
             └─> h5.user_statuses ─> app.detail ─> pc.comment   (demo.post, demo.comment)

demo_js_render — rendered pages at two levels: the js list pages, and every post's js detail
page (a browser page per post; the cost is in docs/browser.md):

    js.feed ─┬─> h5.user_info
             └─> h5.user_statuses ─> js.detail ─> pc.comment

demo_guarded — the pc feed and posts through the guarded front, which answers browsers only:
both steps send through the impersonating fetcher (sites/demo/secure/):

    secure.feed ─> secure.detail                                (demo.post)

demo_mix — the mix front, whose page types are static or filled by script: both endpoints
are written once against a Response (`render="auto"`), fetched where a fetch yields what the
browser does and rendered where it does not (sites/demo/mix/):

    mix.feed ─> mix.detail                                      (demo.post)

Every step below a list is `unique`: if the same user or post is reached twice in a run (a
feed that shifts while being paged), it is crawled once and the stored counts stay exact.
Link items (feed entries, status entries, feed pages) are not stored, so a complete run
stores exactly the site's users + posts + comments.
"""

from __future__ import annotations

from chains import Step, define, step

UNIQUE = {"unique": True}


def _social(front: str, *, detail: str, comment: str) -> Step:
    return step(f"demo.{front}.feed").then(
        step(f"demo.{front}.user_info", user_id="user_id", _options=UNIQUE),
        step(f"demo.{front}.user_statuses", user_id="user_id", _options=UNIQUE).then(
            step(detail, post_id="post_id", _options=UNIQUE).then(
                step(comment, post_id="post_id", _options=UNIQUE)
            )
        ),
    )


def _rendered(list_step: str, detail: str) -> Step:
    return step(list_step).then(
        step("demo.h5.user_info", user_id="user_id", _options=UNIQUE),
        step("demo.h5.user_statuses", user_id="user_id", _options=UNIQUE).then(
            step(detail, post_id="post_id", _options=UNIQUE).then(
                step("demo.pc.comment", post_id="post_id", _options=UNIQUE)
            )
        ),
    )


define("demo_social", _social("h5", detail="demo.app.detail", comment="demo.pc.comment"))
define("demo_h5", _social("h5", detail="demo.h5.detail", comment="demo.h5.comment"))
define("demo_app", _social("app", detail="demo.app.detail", comment="demo.app.comment"))
define("demo_js", _rendered("demo.js.more", detail="demo.app.detail"))
define("demo_js_render", _rendered("demo.js.feed", detail="demo.js.detail"))

define(
    "demo_pc_sharded",
    step("demo.pc.feed_index").then(
        # max_pages=1: each shard fetches its own page only, no "next" link is followed
        step("demo.pc.feed", page="page", _options={"unique": True, "max_pages": 1}).then(
            step("demo.pc.user_statuses", user_id="user_id", _options=UNIQUE).then(
                step(
                    "demo.pc.detail",
                    post_id="post_id",
                    _options={**UNIQUE, "on": "demo.status_entry"},
                ).then(step("demo.pc.comment", post_id="post_id", _options=UNIQUE))
            )
        )
    ),
)

define(
    "demo_guarded",
    step("demo.secure.feed").then(step("demo.secure.detail", post_id="post_id", _options=UNIQUE)),
)
define(
    "demo_mix",
    step("demo.mix.feed").then(step("demo.mix.detail", post_id="post_id", _options=UNIQUE)),
)
