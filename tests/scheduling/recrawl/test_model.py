"""The change model's arithmetic: estimators, the hour profile, where visits go, the budget."""

from __future__ import annotations

import math
import random

import pytest

from scheduling.recrawl import model as m

H, DAY = m.HOUR, m.DAY


def test_improved_estimator_is_finite_when_every_visit_saw_a_change() -> None:
    # naive x / T would say "n changes in n intervals"; the truth may be any rate above it
    assert m.improved_rate(10, 10, 10 * H) == pytest.approx(math.log(21) / H)
    assert m.improved_rate(10, 0, 10 * H) == 0.0
    assert m.improved_rate(0, 0, 0) is None


def test_improved_estimator_beats_the_naive_one_on_incomplete_histories() -> None:
    """Visits every hour of a key changing 1.5 times an hour: most intervals hold several
    changes, which a visit cannot see; the naive estimator counts each interval once."""
    rng = random.Random(7)
    rate, n, interval = 1.5 / H, 400, H
    x = sum(1 for _ in range(n) if rng.expovariate(rate) < interval)  # a change in the interval?
    naive = x / (n * interval)
    improved = m.improved_rate(n, x, n * interval)
    assert improved is not None
    assert abs(improved - rate) < 0.15 * rate < abs(naive - rate)


def test_key_rate_leans_on_the_site_until_visits_accumulate() -> None:
    site = 1 / DAY
    assert m.key_rate(0, 0, 0, site) == site
    one = m.key_rate(1, 1, H, site)  # one lucky visit
    many = m.key_rate(50, 50, 50 * H, site)
    assert site < one < many


def test_exposure_and_active_seconds_of_long_and_short_intervals() -> None:
    assert sum(m.exposure(0, 25 * H)) == pytest.approx(25 * H)
    assert m.exposure(0, 25 * H)[0] == pytest.approx(2 * H)
    assert m.exposure(10 * H + 1800, 11 * H + 600)[10:12] == [1800.0, 600.0]
    assert m.active(0, 7 * H, m.Profile()) == pytest.approx(7 * H)


def _busy(hours: tuple[int, ...]) -> m.Profile:
    w = [3.0 if h in hours else 0.0 for h in range(m.HOURS)]
    return m.Profile(tuple(x / (sum(w) / m.HOURS) for x in w))


def test_profile_learns_the_busy_hours_from_attributed_changes() -> None:
    exposure = [10 * H] * m.HOURS
    changes = [40.0 if h in (8, 9, 20) else 0.5 for h in range(m.HOURS)]
    p = m.Profile.learned(exposure, changes)
    assert sum(p.w) / m.HOURS == pytest.approx(1.0)
    assert p.hot_hours() == [8, 9, 20]
    assert min(p.w) >= m.MIN_WEIGHT / 2
    assert m.Profile.learned([0.0] * 24, [0.0] * 24) == m.Profile()


def test_a_change_is_attributed_to_the_busy_hours_of_its_interval() -> None:
    p = _busy((9,))
    share = m.attribute(6 * H, 12 * H, p)
    assert sum(share) == pytest.approx(1.0)
    assert share[9] > 0.9


def test_next_visit_on_a_flat_day_is_one_over_the_intensity() -> None:
    knobs = m.Knobs(budget=100, min_interval=60, max_interval=30 * DAY, alpha=0.5)
    rate, c = 4 / DAY, 1e-3
    t = m.next_visit(1000.0, rate, c, m.Profile(), knobs)
    assert t - 1000.0 == pytest.approx(1 / (c * rate**0.5), rel=1e-6)


def test_next_visit_keeps_to_min_and_max_interval() -> None:
    knobs = m.Knobs(budget=100, min_interval=600, max_interval=DAY, alpha=0.9)
    assert m.next_visit(0.0, 1.0, 10.0, m.Profile(), knobs) == 600.0
    assert m.next_visit(0.0, 1e-12, 1e-9, m.Profile(), knobs) == DAY
    assert m.next_visit(0.0, 0.0, 1.0, m.Profile(), knobs) == DAY


def test_next_visit_waits_for_the_busy_hours() -> None:
    """Asked at 02:00, a key of a site busy only at 20:00 is visited in that hour."""
    knobs = m.Knobs(budget=100, min_interval=60, max_interval=3 * DAY, alpha=0.75)
    p = _busy((20,))
    t = m.next_visit(2 * H, 1 / DAY, 0.5, p, knobs)
    assert int(t // H) % 24 == 20


def test_the_budget_constant_spends_the_budget() -> None:
    """Sum over keys of each key's visits a day (its intensity integrated over a day) is the budget."""
    knobs = m.Knobs(budget=500, alpha=0.75)
    p = _busy((8, 9, 10, 19, 20))
    rates = [8 / DAY] * 10 + [1 / (30 * DAY)] * 90
    c = m.budget_constant(knobs, sum(r**knobs.alpha for r in rates), p)
    per_day = sum(c * r**knobs.alpha * sum(w**knobs.alpha * H for w in p.w) for r in rates)
    assert per_day == pytest.approx(500)
    assert m.budget_constant(knobs, 0.0, p) == 0.0
