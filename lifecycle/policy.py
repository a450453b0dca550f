"""What a failed page does next: retry, wait, skip or fail, decided from the error alone.

`decide` is pure (no Redis, no Celery, the clock and the jitter passed in), in the shape of
Scrapy's `get_retry_request`: the error, how many attempts the page has had, the endpoint's
retry budget and the settings in; the decision and its countdown out. The task carries it
out (lifecycle/page.py). Each error type's policy is in exceptions.py.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Literal, NamedTuple, Protocol

from config import Settings, get_settings
from exceptions import Policy, Throttled, policy_for

Action = Literal["retry", "wait", "skip", "fail"]
Jitter = Callable[[float, float], float]


class RetryBudget(Protocol):
    """What the decision needs of an endpoint: its own retry cap (None: the settings')."""

    @property
    def max_retries(self) -> int | None: ...


class Decision(NamedTuple):
    """`action` and, for retry and wait, the seconds until the next attempt; `reason` names
    a skip's cause (`robots`, a hook's reason)."""

    action: Action
    countdown: float = 0.0
    reason: str = ""


def countdown_cap(s: Settings) -> float:
    """Countdown retries wait inside the worker unacknowledged: stay under the visibility timeout."""
    return max(1.0, min(s.retry_backoff_max, s.visibility_timeout * 0.5))


def backoff(attempt: int, s: Settings | None = None, jitter: Jitter = random.uniform) -> float:
    """Exponential backoff with equal jitter: half the step fixed, half random."""
    s = s or get_settings()
    step = min(countdown_cap(s), s.retry_backoff * (2.0**attempt))
    return step / 2 + jitter(0, step / 2)


def decide(
    exc: Exception,
    retries_used: int,
    endpoint: RetryBudget,
    settings: Settings,
    waiting_since: float | None = None,
    now: float | None = None,
    jitter: Jitter = random.uniform,
) -> Decision:
    """The next step of a page that raised `exc` after `retries_used` retries (waits for a
    resource not counted). `waiting_since`: when it started waiting for a resource (None:
    it was not waiting), so a pool nobody refills for `resource_wait_max` fails instead."""
    policy = policy_for(exc)
    if policy is Policy.SKIP:  # not sent on purpose (robots.txt): no retry, no dead letter
        return Decision("skip", reason=str(getattr(exc, "reason", "skipped")))
    now = time.time() if now is None else now
    since = waiting_since or now
    if policy is Policy.WAIT and (
        isinstance(exc, Throttled) or now - since < settings.resource_wait_max
    ):  # a contended pool is not a failure; a pool nobody refills for this long is
        return Decision("wait", min(getattr(exc, "retry_after", 2.0), countdown_cap(settings)))
    cap = endpoint.max_retries if endpoint.max_retries is not None else settings.max_retries
    if policy in (Policy.RETRY, Policy.ROTATE) and retries_used < cap:
        countdown = backoff(retries_used, settings, jitter)
        hint = getattr(exc, "retry_after", None)
        if hint:
            countdown = max(countdown, min(float(hint), countdown_cap(settings)))
        return Decision("retry", countdown)
    return Decision("fail")
