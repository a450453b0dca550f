"""Two sites sharing one fleet budget on real workers: the idle one's share goes to the busy
one, and comes back when it wakes.

`tasks=8` in flight for the whole fleet, `alpha=1; beta=1`: two worker processes of 8 slots
each, so the fleet budget, not the slots, decides. Each task holds one 0.5 s request at the
test site, which records when each request starts and ends per site (the timeline).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

import chains
from chains import Chain, step
from config import get_settings
from scheduling.shares import TASKS, FairShare, load_budget
from settings.scheduling import FleetSettings
from tests.conditions import wait_for
from tests.scheduling.server import SchedSite
from utils.redis import get_redis

pytestmark = pytest.mark.integration

FLEET_ENV = {
    "CHAINCRAWL_FLEET_BUDGET": "tasks=8",
    "CHAINCRAWL_FLEET_SHARES": "alpha=1; beta=1",
    "CHAINCRAWL_DEFAULT_LIMITS": "off",  # the fleet's shares alone decide
    "CHAINCRAWL_THROTTLE": "false",
    "CHAINCRAWL_GATE_RETRY": "0.2",
    "CHAINCRAWL_PREFETCH_MULTIPLIER": "4",
}
QUEUES = "alpha,beta,resources,default"
DEADLINE = 20.0  # "within seconds": generous, the machine is shared


def in_flight(site: SchedSite, tag: str, at: float) -> int:
    with site._lock:
        return sum(d for t, g, d in site.flights if g == tag and t <= at)


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until `cond` held."""
    start = time.monotonic()
    wait_for(cond, timeout, what)
    return time.monotonic() - start


def test_an_idle_sites_share_goes_to_the_busy_one_and_comes_back(
    start_workers, sched_site: SchedSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in FLEET_ENV.items():
        monkeypatch.setenv(k, v)
    FleetSettings.forget()
    start_workers(2, concurrency=8, queues=QUEUES, **FLEET_ENV)
    share = FairShare(get_redis(), get_settings().key_prefix, TASKS, load_budget(), 10.0)
    a_tag, b_tag = f"a{uuid.uuid4().hex[:6]}", f"b{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()

    def now_both() -> tuple[int, int]:
        t = time.monotonic()
        return in_flight(sched_site, a_tag, t), in_flight(sched_site, b_tag, t)

    def alpha_back() -> bool:  # alpha has its share back and beta dropped to its own
        a, b = now_both()
        return a >= 3 and b <= 5

    # beta alone: it uses alpha's idle share too (8 in flight, twice its nominal 4)
    beta = chains.run(Chain("beta", step("beta.local.work")),
                      [{"tag": b_tag, "n": i, "s": 0.5} for i in range(120)])  # fmt: skip
    took = wait_until(lambda: now_both()[1] >= 7, DEADLINE, "beta using alpha's idle share")
    print(f"\nbeta alone reached {now_both()[1]} in flight after {took:.1f}s")
    # three rounds of beta alone, so the timeline shows it (the test waits on tasks, not time)
    wait_until(lambda: len(sched_site.tagged(b_tag)) >= 24, DEADLINE, "beta's first rounds")
    # alpha wakes: it gets its share back as beta's tasks finish, beta drops to its own
    woke = time.monotonic()
    alpha = chains.run(Chain("alpha", step("alpha.local.work")),
                       [{"tag": a_tag, "n": i, "s": 0.5} for i in range(60)])  # fmt: skip
    took = wait_until(alpha_back, DEADLINE, "alpha getting its share back")
    print(f"alpha got its share back {took:.1f}s after waking: {now_both()} in flight")
    view = share.view()
    assert view["alpha"]["share"] == pytest.approx(4, abs=0.01)  # both busy: 4 and 4
    assert view["beta"]["share"] == pytest.approx(4, abs=0.01)
    for run in (alpha, beta):
        p = run.wait(timeout=120)
        assert p.ok and p.totals["succeeded"] == p.totals["dispatched"]
    end = time.monotonic()
    # never more than the fleet's 8 at once at the site, whoever held them
    with sched_site._lock:
        events = sorted((t, d) for t, g, d in sched_site.flights if g in (a_tag, b_tag))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak <= 8, peak
    # the timeline the docs show: in flight per site every half second, alpha woke at `woke`
    print(f"alpha woke at {woke - t0:.1f}s; t(s) alpha/beta in flight:")
    t = t0
    while t <= end:
        print(
            f"  {t - t0:5.1f} {in_flight(sched_site, a_tag, t)}/{in_flight(sched_site, b_tag, t)}"
        )
        t += 0.5
