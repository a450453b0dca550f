"""Paging arithmetic and opaque cursors, shared by the front ends and `expected_counts`.

Kept in one place so the server and the promised counts can never disagree.
"""

from __future__ import annotations

import base64
import binascii


def page_count(total: int, size: int) -> int:
    """Pages needed to list `total` entries `size` at a time; an empty list is still one page."""
    if size < 1:
        raise ValueError("page size must be >= 1")
    return max(1, -(-total // size))


def encode_cursor(scope: str, offset: int) -> str:
    """An opaque, URL-safe cursor naming a position in one list (`scope`)."""
    raw = f"{scope}|{offset}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, scope: str) -> int:
    """Offset encoded in `cursor`; ValueError if it is malformed or belongs to another list."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("malformed cursor") from None
    got_scope, _, offset = raw.rpartition("|")
    if got_scope != scope or not offset.isdigit():
        raise ValueError("cursor does not belong to this list")
    return int(offset)
