"""An item type's storage declarations: checked when the class is defined, and registered as
the type's storage policy (what the sinks read)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from external_interface.storage.routing import type_policies
from lifecycle.endpoints import Item


def test_history_and_search_fields_become_the_types_policy() -> None:
    class Story(Item):
        item_type: ClassVar[str] = "test.decl.story"
        key_fields: ClassVar[tuple[str, ...]] = ("story_id",)
        history_fields: ClassVar[tuple[str, ...]] = ("likes", "stats.views")
        search_fields: ClassVar[tuple[str, ...]] = ("title",)

        story_id: str
        title: str
        likes: int
        stats: dict[str, int]

    policy = type_policies.for_type("test.decl.story")
    assert policy.track == ("likes", "stats.views") and policy.search == ("title",)
    assert Story.history_fields == ("likes", "stats.views")


def test_a_name_that_is_not_a_field_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"history_fields names \['likez'\], not fields"):

        class Bad(Item):
            item_type: ClassVar[str] = "test.decl.bad"
            key_fields: ClassVar[tuple[str, ...]] = ("bad_id",)
            history_fields: ClassVar[tuple[str, ...]] = ("likez",)

            bad_id: str
            likes: int

    with pytest.raises(TypeError, match="search_fields must be a tuple of names"):

        class Worse(Item):
            item_type: ClassVar[str] = "test.decl.worse"
            key_fields: ClassVar[tuple[str, ...]] = ("worse_id",)
            search_fields: ClassVar[tuple[str, ...]] = "title"  # type: ignore[assignment]

            worse_id: str
            title: str


def test_a_type_declaring_nothing_leaves_the_policies_alone() -> None:
    class Plain(Item):
        item_type: ClassVar[str] = "test.decl.plain"
        key_fields: ClassVar[tuple[str, ...]] = ("plain_id",)

        plain_id: str

    assert "test.decl.plain" not in type_policies.rules
