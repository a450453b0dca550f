"""What the parser tests expect: the demo's own data model, and a fetcher for saved pages.

The fixtures were saved from `size="tiny"` servers (seed 42), so `demo.data.Dataset` computes
every field a parser must find in them; comparing whole items catches any field gone wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from base_task import FixtureFetcher, Follow, Item, run_endpoint
from demo.data import Dataset
from sites.demo.items import Comment, FeedEntry, Post, StatusEntry, User

HERE = Path(__file__).parent
DATA = Dataset(42, 5, 3, 4)  # size tiny
SMALL = Dataset(42, 20, 5, 5)  # size small: the verified user's page


def fixture(platform: str, name: str) -> Path:
    return HERE / platform / "fixtures" / name


def run(
    task: str, params: dict[str, Any], platform: str, name: str | bytes, status: int = 200
) -> tuple[list[Item], list[Follow], FixtureFetcher]:
    """Run an endpoint offline against one saved page (served for any path)."""
    src = name if isinstance(name, bytes) else fixture(platform, name)
    fetcher = FixtureFetcher({"^/": src}, status=status)
    items, follows = run_endpoint(task, params, fetcher)
    return items, follows, fetcher


def user(uid: str, data: Dataset = DATA) -> User:
    u = data.user(uid)
    assert u is not None
    return User.from_api(u.to_dict())


def post(pid: str) -> Post:
    return Post.from_api(_with_author(pid, full=True))


def feed_entry(pid: str) -> FeedEntry:
    return FeedEntry.from_api(_with_author(pid))


def status_entry(pid: str) -> StatusEntry:
    p = DATA.post(pid)
    assert p is not None
    return StatusEntry.from_api(p.to_summary_dict())


def comment(cid: str) -> Comment:
    c = DATA.comment(cid)
    assert c is not None
    return Comment.from_api(c.to_dict())


def feed_ids(offset: int, limit: int) -> list[str]:
    return [p.id for p in DATA.feed(offset, limit)]


def _with_author(pid: str, full: bool = False) -> dict[str, Any]:
    p = DATA.post(pid)
    assert p is not None
    return DATA.with_author(p, full=full)
