"""Re-save the demo parser tests' pages from live demo servers:

    .venv/bin/python -m tests.sites.demo.save_fixtures

Pages come from `size="tiny"` (seed 42) with small page sizes, so every list spans several
pages and the tests see a first page (with a next link / cursor / has_more) and a last one.
The login wall and the ban page come from servers with those features switched on; one
verified user's page comes from `size="small"` (tiny has no verified user).
The parser tests compare what they parse with `demo.data.Dataset(42, 5, 3, 4)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import requests

from demo.testing import DemoServer

HERE = Path(__file__).parent

# Page sizes of the fixture server, and the app `size` the app fixtures were fetched with.
PAGED: dict[str, Any] = dict(
    size="tiny", pc_feed_page_size=2, pc_user_page_size=2, pc_comments_page_size=3,
    h5_feed_page_size=2, h5_statuses_page_size=2, h5_comments_page_size=3,
)  # fmt: skip
APP_SIZES = {"feed": 2, "statuses": 2, "comments": 3}
TINY = dict(users=5, posts_per_user=3, comments_per_post=4)


def save(s: requests.Session, base: str, url: str, dest: str, ok: tuple[int, ...] = (200,)) -> Any:
    r = s.get(base + url, timeout=10)
    if r.status_code not in ok:
        raise RuntimeError(f"{url}: HTTP {r.status_code} {r.text[:200]}")
    path = HERE / dest
    path.write_bytes(r.content)  # the bytes as sent: GBK pages stay GBK
    print(f"{dest:40} <- {url} ({r.status_code}, {r.headers.get('content-type')})")
    return r.json() if "json" in r.headers.get("content-type", "") else None


def walk_h5(s: requests.Session, base: str, path: str, first: str, last: str) -> None:
    """Save the first and the last page of a cursor-paged h5 list."""
    body = save(s, base, path, first)
    cursor = body["data"]["next_cursor"]
    while True:
        url = f"{path}?cursor={cursor}"
        body = s.get(base + url, timeout=10).json()
        if body["data"]["next_cursor"] is None:
            save(s, base, url, last)
            return
        cursor = body["data"]["next_cursor"]


def paged_pages(s: requests.Session, base: str) -> None:
    a = APP_SIZES
    for url, dest in [
        ("/pc/feed?page=1", "pc/fixtures/feed_page1.html"),
        ("/pc/feed?page=3", "pc/fixtures/feed_page3.html"),
        ("/pc/user/u1?page=1", "pc/fixtures/user_u1_page1.html"),
        ("/pc/user/u1?page=2", "pc/fixtures/user_u1_page2.html"),
        ("/pc/post/p3", "pc/fixtures/post_p3.html"),
        ("/pc/post/p3/comments?page=1", "pc/fixtures/comments_p3_page1.html"),
        ("/pc/post/p3/comments?page=2", "pc/fixtures/comments_p3_page2.html"),
        ("/h5/api/user/u1", "h5/fixtures/user_u1.json"),
        ("/h5/api/post/p3", "h5/fixtures/post_p3.json"),
        (f"/app/api/feed?page=1&size={a['feed']}", "app/fixtures/feed_page1.json"),
        (f"/app/api/feed?page=3&size={a['feed']}", "app/fixtures/feed_page3.json"),
        ("/app/api/user_info?user_id=u1", "app/fixtures/user_info_u1.json"),
        (f"/app/api/user_statuses?user_id=u1&page=1&size={a['statuses']}", "app/fixtures/statuses_u1_page1.json"),
        (f"/app/api/user_statuses?user_id=u1&page=2&size={a['statuses']}", "app/fixtures/statuses_u1_page2.json"),
        ("/app/api/detail?post_id=p3", "app/fixtures/detail_p3.json"),
        (f"/app/api/comments?post_id=p3&page=1&size={a['comments']}", "app/fixtures/comments_p3_page1.json"),
        (f"/app/api/comments?post_id=p3&page=2&size={a['comments']}", "app/fixtures/comments_p3_page2.json"),
    ]:  # fmt: skip
        save(s, base, url, dest)
    walk_h5(s, base, "/h5/api/feed", "h5/fixtures/feed_first.json", "h5/fixtures/feed_last.json")
    walk_h5(s, base, "/h5/api/user/u1/statuses", "h5/fixtures/statuses_u1_first.json",
            "h5/fixtures/statuses_u1_last.json")  # fmt: skip
    walk_h5(s, base, "/h5/api/post/p3/comments", "h5/fixtures/comments_p3_first.json",
            "h5/fixtures/comments_p3_last.json")  # fmt: skip


def main() -> None:
    with requests.Session() as s:
        with DemoServer(**PAGED) as demo:
            assert demo.config.users == TINY["users"]
            paged_pages(s, demo.url)
        with DemoServer(size="small") as demo:
            save(s, demo.url, "/pc/user/u6", "pc/fixtures/user_u6_verified.html")
        with DemoServer(size="tiny", features=["login"]) as demo:
            save(s, demo.url, "/pc/post/p3/comments", "pc/fixtures/login_wall.html")
            save(s, demo.url, "/h5/api/post/p3/comments", "h5/fixtures/login_required.json", (401,))
            save(s, demo.url, "/app/api/comments?post_id=p3", "app/fixtures/login_required.json",
                 (401,))  # fmt: skip
        ban: dict[str, Any] = dict(
            features=["rate_limit"], rate_limit_requests=1, rate_limit_ban_after=1
        )
        with DemoServer(size="tiny", **ban) as demo:
            s.get(demo.url + "/pc/feed", timeout=10)  # the one allowed request
            save(s, demo.url, "/pc/feed", "pc/fixtures/banned.html", (403,))
            save(s, demo.url, "/h5/api/feed", "h5/fixtures/banned.json", (403,))
            save(s, demo.url, "/app/api/feed", "app/fixtures/banned.json", (403,))


if __name__ == "__main__":
    main()
