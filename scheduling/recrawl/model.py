"""The change model: how often a key changes, at which hours its site changes, and when to
visit it next within a budget. Pure arithmetic, no Redis: `history.py` keeps the numbers,
`planner.py` and `observe.py` call these.

Each key changes as a Poisson process whose intensity is the key's rate times its site's
profile of the hour of day: `lambda_k * w(hour)`, the profile's 24 weights averaging 1. Time
is measured in *active seconds* (wall seconds weighted by `w`), so a visit interval that
covered the site's busy evening counts for more than one that covered its quiet night, and
the probability that a key did not change over an interval is `exp(-lambda_k * active)`.

Per key we keep, over its visits: `n` intervals between two visits, `x` of them ended by a
changed value, and `active` seconds they covered. The rate is Cho and Garcia-Molina's
estimator for incomplete change histories (a visit sees *whether* the value changed, not how
often): `-ln((n - x + 0.5) / (n + 0.5)) / (active / n)`, which stays finite when every visit
saw a change and is nearly unbiased where the naive `x / active` undercounts. With few visits
it leans on the site's pooled rate (`PRIOR_VISITS` pseudo-visits at that rate).

Visits follow an intensity `c * (lambda_k * w(t)) ** alpha`: `alpha` 0.5 is the square-root
rule that minimises the mean delay from a change to its capture for a given number of fetches,
1 the proportional rule that maximises the share of fetches finding a change; between them
both are served. `c` spends the budget: the sum of every key's daily visits is the site's
pages per day. The next visit is where the intensity integrated from the last one reaches 1,
kept between `min_interval` and `max_interval` (the floor every stable key decays to).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

HOUR = 3600.0
DAY = 86_400.0
HOURS = 24
PRIOR_VISITS = 2.0  # pseudo-visits at the site's pooled rate a key's own estimate is blended with
PROFILE_PRIOR = 2.0  # pseudo-changes spread flat over the day before the hours are learned
MIN_WEIGHT = 0.05  # no hour is ever fully quiet: a change there is still found, later
_MAX_STEPS = 24 * 400  # hours walked at most when placing a visit (past max_interval anyway)


@dataclass(frozen=True)
class Profile:
    """A site's hour-of-day weights (UTC), averaging 1: `w[h]` is how much busier than its
    average the site changes in hour `h`."""

    w: tuple[float, ...] = (1.0,) * HOURS

    @classmethod
    def learned(cls, exposure: Sequence[float], changes: Sequence[float]) -> Profile:
        """From the seconds observed in each hour and the changes attributed to it: each
        hour's rate with `PROFILE_PRIOR` changes spread flat, floored at MIN_WEIGHT of the mean."""
        total_exp = sum(exposure)
        total_chg = sum(changes)
        if total_exp <= 0:
            return cls()
        mean_rate = (total_chg + PROFILE_PRIOR) / total_exp
        prior_exp = PROFILE_PRIOR / HOURS / mean_rate  # the flat prior's seconds per hour
        rates = [
            (c + PROFILE_PRIOR / HOURS) / (e + prior_exp)
            for e, c in zip(exposure, changes, strict=True)
        ]
        avg = sum(rates) / HOURS
        w = [max(MIN_WEIGHT, r / avg) for r in rates]
        norm = sum(w) / HOURS
        return cls(tuple(x / norm for x in w))

    def at(self, t: float) -> float:
        return self.w[int(t // HOUR) % HOURS]

    def mean_power(self, alpha: float) -> float:
        """The day's mean of `w ** alpha` (what the budget constant divides by)."""
        return sum(x**alpha for x in self.w) / HOURS

    def hot_hours(self, above: float = 1.5) -> list[int]:
        """The hours at least `above` times as busy as the average (for `status`)."""
        return [h for h, x in enumerate(self.w) if x >= above]


def _pieces(t0: float, t1: float) -> Iterable[tuple[int, float]]:
    """(hour of day, seconds) of the interval [t0, t1), cut at each hour."""
    t = t0
    while t < t1:
        end = min(t1, (math.floor(t / HOUR) + 1) * HOUR)
        yield int(t // HOUR) % HOURS, end - t
        t = end


def exposure(t0: float, t1: float) -> list[float]:
    """Seconds of [t0, t1) in each hour of the day (an interval longer than a day wraps)."""
    out = [0.0] * HOURS
    full, rest = divmod(max(0.0, t1 - t0), DAY)
    if full:
        out = [full * HOUR] * HOURS
    for h, s in _pieces(t1 - rest, t1):
        out[h] += s
    return out


def active(t0: float, t1: float, profile: Profile) -> float:
    """Active seconds of [t0, t1): wall seconds weighted by the profile."""
    return sum(s * profile.w[h] for h, s in enumerate(exposure(t0, t1)) if s)


def attribute(t0: float, t1: float, profile: Profile) -> list[float]:
    """Where a change seen at t1 (and not at t0) most likely happened: one unit spread over
    the hours of (t0, t1] in proportion to their seconds times the profile (an online EM
    step: the hours the site is known to change in take most of it)."""
    exp = exposure(t0, t1)
    weighted = [s * profile.w[h] for h, s in enumerate(exp)]
    total = sum(weighted)
    if total <= 0:
        return [0.0] * HOURS
    return [x / total for x in weighted]


def improved_rate(n: float, x: float, active_seconds: float) -> float | None:
    """Cho and Garcia-Molina's estimator for an incomplete change history: changes per active
    second from `n` visit intervals, `x` of which ended changed, covering `active_seconds`.
    None without an interval to judge by."""
    if n <= 0 or active_seconds <= 0:
        return None
    x = min(max(x, 0.0), n)
    mean_interval = active_seconds / n
    return -math.log((n - x + 0.5) / (n + 0.5)) / mean_interval


def key_rate(n: float, x: float, active_seconds: float, site_rate: float) -> float:
    """A key's rate: its own estimate blended with the site's pooled one by visits seen
    (`PRIOR_VISITS` pseudo-visits at the site's rate), so one lucky visit does not make a key hot."""
    own = improved_rate(n, x, active_seconds)
    if own is None:
        return site_rate
    return (n * own + PRIOR_VISITS * site_rate) / (n + PRIOR_VISITS)


@dataclass(frozen=True)
class Knobs:
    """A watched step's scheduling settings (`schedules.yaml`, `by_change:`)."""

    budget: float  # pages per day for the whole watched set
    min_interval: float = 600.0  # never visit a key more often than this
    max_interval: float = 7 * DAY  # every key is visited at least this often (the floor)
    alpha: float = 0.75  # 0.5 least delay ... 1.0 most changes per fetch


def budget_constant(knobs: Knobs, rate_power_sum: float, profile: Profile) -> float:
    """`c` such that the keys' visits add up to the budget: sum over keys of the day's mean
    intensity `c * lambda_k**alpha * mean(w**alpha)` = budget per second. `rate_power_sum` is
    the sum over the keys of `lambda_k ** alpha` (rates per active second)."""
    denom = rate_power_sum * profile.mean_power(knobs.alpha)
    if denom <= 0:
        return 0.0
    return knobs.budget / DAY / denom


def next_visit(now: float, rate: float, c: float, profile: Profile, knobs: Knobs) -> float:
    """When the key is visited next: the intensity `c * (rate * w(t)) ** alpha`, integrated
    hour by hour from `now`, reaches 1 (between min_interval and max_interval from now)."""
    lo, hi = now + knobs.min_interval, now + knobs.max_interval
    if c <= 0 or rate <= 0:
        return hi
    base = c * rate**knobs.alpha
    acc, t = 0.0, now
    for _ in range(_MAX_STEPS):
        if t >= hi:
            return hi
        end = (math.floor(t / HOUR) + 1) * HOUR
        f = base * profile.at(t) ** knobs.alpha
        if f > 0 and t + (1.0 - acc) / f <= end:
            return min(hi, max(lo, t + (1.0 - acc) / f))
        acc += f * (end - t)
        t = end
    return hi
