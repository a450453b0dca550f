"""What a request's outcome says about the proxy that carried it, for one site: the event
(`judge_outcome`), how long a ban benches the proxy (`ban_hold`), and the task's avoid list.

Used alike by the providers (every crawl request) and the per-site validator, so a check of a
site's page is judged exactly as a real request to it.
"""

from __future__ import annotations

import re

from external_interface.resources.base import Outcome, TaskState
from external_interface.resources.inflight import avoid_next_time, avoided
from external_interface.resources.proxy.models import Event, classify
from external_interface.resources.rules import Verdict, site_rule
from settings.proxy import ProxySettings

KIND = "proxy"

_VERDICT_EVENT = {
    Verdict.OK: Event.SUCCESS,
    Verdict.NEUTRAL: Event.NEUTRAL,
    Verdict.FAILED: Event.BANNED,
    Verdict.BANNED: Event.BANNED,
}
_RETRY_AFTER_IN_BODY = re.compile(r"""retry[_-]after["']?\s*[:=]\s*["']?(\d+(?:\.\d+)?)""", re.I)


def judge_outcome(site: str, outcome: Outcome) -> Event:
    """What a request says about the proxy that carried it, for this site.

    Transport failures (dead, timed out) are always the proxy's. An answer goes first to the
    site's own proxy rules (`rules.add_rules(site, "proxy", ...)`), because a site's 401/403 is
    often about something else that was lent (a session, a device, a user agent): blaming the
    proxy for those benches healthy proxies until the channel runs dry. Without a rule,
    `classify` decides (401/403/429 are bans).
    """
    event = classify(outcome.status, outcome.error)
    if event in (Event.DEAD, Event.TIMEOUT):
        return event
    rule = site_rule(site, KIND, outcome)
    return _VERDICT_EVENT[rule.verdict] if rule is not None else event


def ban_hold(outcome: Outcome, settings: ProxySettings) -> float | None:
    """How long a ban keeps the proxy out of the channel: the site's Retry-After (header, or a
    `retry_after` field in the body), else `throttle_ttl` for a 429, else None (`ban_ttl`).
    A rate limit is over in seconds; benching the proxy for an hour would empty the channel."""
    hint = outcome.retry_after
    if hint is None and outcome.text_sample:
        m = _RETRY_AFTER_IN_BODY.search(outcome.text_sample)
        hint = float(m.group(1)) if m else None
    if hint is not None:
        return max(hint, 0.5)
    return settings.throttle_ttl if outcome.status == 429 else None


def avoided_proxies(task: TaskState) -> set[str]:
    """Proxy ids this task must not get again (`task.avoid` holds "proxy:<id>")."""
    return avoided(task, KIND)


def note_failure(task: TaskState, proxy_id: str, event: Event) -> None:
    """Put a failed proxy into `task.avoid` so the retry gets another (the fetch layer may too)."""
    if event in (Event.DEAD, Event.TIMEOUT, Event.BANNED):
        avoid_next_time(task, KIND, proxy_id)
