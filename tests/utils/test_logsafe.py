"""The log filter masks secrets and leaves names readable (a pool's `kind:site`, Redis keys)."""

from __future__ import annotations

import logging

import pytest

from utils.logsafe import RedactingFilter, redact


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Set-Cookie: session=abc123; Path=/", "abc123"),
        ("Cookie: sid_token=zzz999", "zzz999"),
        ("login with password=hunter2 failed", "hunter2"),
        ("password = 'hunter2'", "hunter2"),
        ("via http://user:hunter2@127.0.0.2:8080/x", "hunter2"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9", "eyJhbGciOiJIUzI1NiJ9"),
        ("authorization:Bearer eyJhbGciOiJIUzI1NiJ9", "eyJhbGciOiJIUzI1NiJ9"),
        ("token: 5f2b9c", "5f2b9c"),
    ],
)
def test_secrets_are_masked(text: str, secret: str) -> None:
    assert secret not in redact(text) and "***" in redact(text)


@pytest.mark.parametrize(
    "text",
    [
        "ALERT FIRING [p] size of pool cookie:shop is 0 (< 1)",
        "key cc:session:shop:members is empty",
        "leased token:demo to demo.pc.feed",
    ],
)
def test_names_with_a_colon_stay_readable(text: str) -> None:
    assert redact(text) == text


def test_the_filter_rewrites_the_record_every_handler_sees() -> None:
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "password=%s", ("hunter2",), None)
    assert RedactingFilter().filter(rec) and rec.getMessage() == "password=***"
    keep = logging.LogRecord("x", logging.INFO, __file__, 1, "pool %s", ("cookie:shop",), None)
    assert RedactingFilter().filter(keep) and keep.getMessage() == "pool cookie:shop"
