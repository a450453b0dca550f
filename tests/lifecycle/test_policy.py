"""The failure policy as a table: error, retries used, waiting since -> decision."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from config import Settings
from exceptions import (
    BannedError,
    HookSkip,
    NotFound,
    ParseError,
    PoisonMessage,
    ResourceUnavailable,
    RobotsDisallowed,
    ServerError,
    Throttled,
)
from lifecycle.policy import Decision, backoff, countdown_cap, decide

S = Settings(max_retries=3, retry_backoff=1.0, retry_backoff_max=60.0, visibility_timeout=40,
             resource_wait_max=300.0)  # fmt: skip
NOW = 1_000_000.0


def half(lo: float, hi: float) -> float:
    """The jitter at its upper end: the countdown is then the full step."""
    return hi


@dataclass
class Endpoint:
    max_retries: int | None = None


class Hinted(ServerError):
    retry_after = 15.0


@pytest.mark.parametrize(
    ("exc", "used", "endpoint", "since", "want"),
    [
        (RobotsDisallowed("no"), 0, Endpoint(), None, Decision("skip", reason="robots")),
        (HookSkip("no", reason="stale"), 5, Endpoint(), None, Decision("skip", reason="stale")),
        (Throttled("busy", retry_after=3.0), 99, Endpoint(), NOW - 1e6, Decision("wait", 3.0)),
        (ResourceUnavailable("empty", 50.0), 0, Endpoint(), None, Decision("wait", 20.0)),
        (ResourceUnavailable("empty"), 0, Endpoint(), NOW - 299, Decision("wait", 2.0)),
        (ResourceUnavailable("empty"), 0, Endpoint(), NOW - 301, Decision("fail")),
        (ParseError("x"), 0, Endpoint(), None, Decision("retry", 1.0)),
        (ParseError("x"), 2, Endpoint(), None, Decision("retry", 4.0)),
        (ParseError("x"), 3, Endpoint(), None, Decision("fail")),
        (ParseError("x"), 3, Endpoint(max_retries=5), None, Decision("retry", 8.0)),
        (ParseError("x"), 0, Endpoint(max_retries=0), None, Decision("fail")),
        (BannedError("ban"), 1, Endpoint(), None, Decision("retry", 2.0)),
        (Hinted("5xx", 503), 0, Endpoint(), None, Decision("retry", 15.0)),
        (ValueError("a bug"), 0, Endpoint(), None, Decision("retry", 1.0)),
        (NotFound("gone", 404), 0, Endpoint(), None, Decision("fail")),
        (PoisonMessage("dies"), 0, Endpoint(), None, Decision("fail")),
    ],
)
def test_each_error_gets_its_decision(
    exc: Exception, used: int, endpoint: Endpoint, since: float | None, want: Decision
) -> None:
    assert decide(exc, used, endpoint, S, waiting_since=since, now=NOW, jitter=half) == want


def test_a_countdown_stays_under_half_the_visibility_timeout() -> None:
    assert countdown_cap(S) == 20.0
    assert backoff(10, S, half) == 20.0
    assert decide(ParseError("x"), 2, Endpoint(10), S, jitter=lambda lo, hi: lo) == (
        "retry",
        2.0,
        "",
    )
