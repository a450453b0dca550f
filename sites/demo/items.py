"""Item types shared by the demo's pc, h5 and app endpoints.

The three front ends serve the same records, so a user, post or comment has one item type and
one key whichever front end found it: sinks upsert by the key, and a chain may mix front ends.

Stored: `demo.user`, `demo.post`, `demo.comment` (the records a crawl is for).
Their moving counts keep a history (`history_fields`: every version with its interval, in the
sinks that keep one) and their text is searchable in the postgres sink (`search_fields`).
Not stored (`store = False`): the link items of list pages — feed entries, a user's status
list, feed page numbers — which exist to feed child steps. Storing them would count every
post twice, and the full record comes from the detail step anyway.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

from base_task import Item
from exceptions import ParseError


class DemoItem(Item):
    """Base of the demo items: `from_api` builds one from an h5/app JSON object."""

    # item field -> dotted path in the API object, where the names differ
    api: ClassVar[dict[str, str]] = {}

    @classmethod
    def from_api(cls, obj: Any) -> Self:
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            path = cls.api.get(name, name)
            value = obj
            for part in path.split("."):
                if not isinstance(value, dict) or part not in value:
                    raise ParseError(
                        f"{cls.item_type}: API object lacks {path!r}: {str(obj)[:120]}"
                    )
                value = value[part]
            values[name] = value
        return cls(**values)


class User(DemoItem):
    item_type: ClassVar[str] = "demo.user"
    key_fields: ClassVar[tuple[str, ...]] = ("user_id",)
    history_fields: ClassVar[tuple[str, ...]] = ("followers", "post_count")
    search_fields: ClassVar[tuple[str, ...]] = ("name", "bio")
    api: ClassVar[dict[str, str]] = {"user_id": "id"}

    user_id: str
    name: str
    bio: str
    location: str
    followers: int
    post_count: int
    verified: bool


class Post(DemoItem):
    item_type: ClassVar[str] = "demo.post"
    key_fields: ClassVar[tuple[str, ...]] = ("post_id",)
    history_fields: ClassVar[tuple[str, ...]] = ("likes", "comments_count")
    search_fields: ClassVar[tuple[str, ...]] = ("title", "summary", "content")
    api: ClassVar[dict[str, str]] = {"post_id": "id", "user_name": "user.name"}

    post_id: str
    user_id: str
    user_name: str
    title: str
    summary: str
    content: str
    likes: int
    comments_count: int
    created_at: int  # unix seconds, UTC


class Comment(DemoItem):
    item_type: ClassVar[str] = "demo.comment"
    key_fields: ClassVar[tuple[str, ...]] = ("comment_id",)
    history_fields: ClassVar[tuple[str, ...]] = ("likes",)
    search_fields: ClassVar[tuple[str, ...]] = ("text",)
    api: ClassVar[dict[str, str]] = {"comment_id": "id"}

    comment_id: str
    post_id: str
    user_id: str
    user_name: str
    text: str
    likes: int
    created_at: int


class FeedEntry(DemoItem):
    """One feed entry: a user's newest post. Feeds user and post steps."""

    item_type: ClassVar[str] = "demo.feed_entry"
    key_fields: ClassVar[tuple[str, ...]] = ("post_id",)
    store: ClassVar[bool] = False
    api: ClassVar[dict[str, str]] = {"post_id": "id", "user_name": "user.name"}

    post_id: str
    user_id: str
    user_name: str
    title: str
    summary: str
    likes: int
    comments_count: int
    created_at: int


class StatusEntry(DemoItem):
    """One post in a user's status list (the fields every front end shows there)."""

    item_type: ClassVar[str] = "demo.status_entry"
    key_fields: ClassVar[tuple[str, ...]] = ("post_id",)
    store: ClassVar[bool] = False
    api: ClassVar[dict[str, str]] = {"post_id": "id"}

    post_id: str
    user_id: str
    title: str
    likes: int
    created_at: int


class FeedPage(DemoItem):
    """One pc feed index page number: the shards that let every index page be fetched at once."""

    item_type: ClassVar[str] = "demo.feed_page"
    key_fields: ClassVar[tuple[str, ...]] = ("page",)
    store: ClassVar[bool] = False

    page: int
    total_pages: int
