"""Ban rules: what a response says about each member lent for it (a session, a device, a proxy).

A site registers its rules per pool kind when its modules load (`add_rules(site, kind, ...)`);
the first rule whose status matches and (if given) one of whose markers occurs in the body's
first bytes decides. The cookie and device pools then fall back on `GENERIC_RULES` and the
status (`judge`); the proxy layer asks only for the site's own rules (`site_rule`) and keeps
its own default classification.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from exceptions import BannedError, LoginRequired
from external_interface.resources.base import Outcome


class Verdict:
    """What a response says about the member that was lent for it."""

    OK = "ok"  # it worked: score +1
    FAILED = "failed"  # the member's fault (e.g. an unexplained 403): score -penalty
    NEUTRAL = "neutral"  # not the member's business (5xx, timeouts, an IP ban): no change
    BANNED = "banned"  # the site rejected the member: retire it, raise a BannedError


@dataclass(frozen=True)
class Rule:
    """A ban-detection rule: matches when the status fits (None = any) and, if `markers` are
    given, one of them occurs in the body's first bytes."""

    verdict: str
    status: frozenset[int] | None = None
    markers: tuple[str, ...] = ()
    error: type[BannedError] = BannedError
    reason: str = ""

    def matches(self, outcome: Outcome) -> bool:
        if outcome.status is None:
            return False
        if self.status is not None and outcome.status not in self.status:
            return False
        return not self.markers or any(m in outcome.text_sample for m in self.markers)


def rule(
    verdict: str,
    status: Iterable[int] | None = None,
    markers: Iterable[str] = (),
    error: type[BannedError] = BannedError,
    reason: str = "",
) -> Rule:
    return Rule(
        verdict, frozenset(status) if status is not None else None, tuple(markers), error, reason
    )


_RULES: dict[tuple[str, str], list[Rule]] = {}

# What every site gets after its own rules: generic signs of a dead session or device.
GENERIC_RULES: dict[str, list[Rule]] = {
    "cookie": [
        rule(Verdict.BANNED, {401}, error=LoginRequired, reason="401"),
        rule(Verdict.FAILED, {403}, reason="403"),
    ],
    "device_id": [rule(Verdict.FAILED, {401, 403}, reason="forbidden")],
}


def add_rules(site: str, kind: str, *rules: Rule) -> None:
    """Register a site's ban rules for a pool kind; earlier rules win."""
    _RULES.setdefault((site, kind), []).extend(rules)


def site_rule(site: str, kind: str, outcome: Outcome) -> Rule | None:
    """The first of the site's own rules for `kind` that matches (no generic rules): lets a
    provider with its own default judgement (the proxy's `classify`) defer to the site."""
    return next((r for r in _RULES.get((site, kind), ()) if r.matches(outcome)), None)


def judge(site: str, kind: str, outcome: Outcome) -> tuple[str, Rule | None]:
    """The verdict on a lent member: the site's rules, then the generic ones, then by status."""
    for r in (*_RULES.get((site, kind), ()), *GENERIC_RULES.get(kind, ())):
        if r.matches(outcome):
            return r.verdict, r
    if outcome.error is not None or outcome.status is None:
        return Verdict.NEUTRAL, None
    return (Verdict.OK if outcome.status < 400 else Verdict.NEUTRAL), None


__all__ = ["GENERIC_RULES", "Rule", "Verdict", "add_rules", "judge", "rule", "site_rule"]
