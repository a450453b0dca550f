"""Default per-site limits: the `*` entry every site without its own entry gets, unless
CHAINCRAWL_LIMITS has a `*` or the default is `off`; obeyed by real workers together."""

from __future__ import annotations

import uuid

import pytest

import chains
from chains import Chain, step
from config import Settings, get_settings, reset_settings
from exceptions import ConfigError
from scheduling.gate import NoopGate, RedisGate, get_gate, reset_gate
from scheduling.limits import default_limit, effective_limits
from scheduling.tasks import check_limits
from tests.scheduling.server import SchedSite
from tests.scheduling.test_limits_workers import wait_done


def test_the_default_is_the_star_entry() -> None:
    s = Settings(limits="", default_limits="4/s,8")
    assert effective_limits(s)["*"].describe() == "4/s, max 8 in flight"
    default = default_limit(Settings(default_limits="4/s,8"))
    assert default is not None and default.rate == 4.0
    for off in ("off", "", "none", " OFF "):
        assert default_limit(Settings(default_limits=off)) is None
        assert effective_limits(Settings(limits="", default_limits=off)) == {}


def test_an_explicit_star_or_site_entry_wins(rds) -> None:
    s = Settings(limits="*=2/s; news=50/s,16", default_limits="4/s,8")
    limits = effective_limits(s)
    assert limits["*"].describe() == "2/s"
    gate = RedisGate(limits, settings=s, client=rds)
    assert [lim.describe() for lim in gate.scopes("news", "news.pc.list")] == [
        "50/s, max 16 in flight"
    ]
    assert [lim.describe() for lim in gate.scopes("blog", "blog.pc.list")] == ["2/s"]
    limits = effective_limits(Settings(limits="news=50/s", default_limits="4/s,8"))
    gate = RedisGate(limits, settings=s, client=rds)
    assert [(lim.scope, lim.rate) for lim in gate.scopes("blog", "blog.pc.list")] == [("blog", 4.0)]


def test_a_bad_default_names_its_setting(monkeypatch) -> None:
    with pytest.raises(ConfigError, match="CHAINCRAWL_DEFAULT_LIMITS: 'fast'"):
        effective_limits(Settings(limits="", default_limits="fast"))
    monkeypatch.setenv("CHAINCRAWL_DEFAULT_LIMITS", "4/s,fast")
    try:
        reset_settings()
        with pytest.raises(ConfigError, match="CHAINCRAWL_DEFAULT_LIMITS"):
            check_limits()  # the worker refuses to start
    finally:
        monkeypatch.undo()
        reset_settings()


def test_the_gate_is_the_redis_one_while_the_default_is_on(monkeypatch) -> None:
    monkeypatch.setenv("CHAINCRAWL_LIMITS", "")
    monkeypatch.delenv("CHAINCRAWL_GATE", raising=False)
    try:
        monkeypatch.setenv("CHAINCRAWL_DEFAULT_LIMITS", "off")
        reset_settings()
        reset_gate()
        assert isinstance(get_gate(), NoopGate)
        monkeypatch.setenv("CHAINCRAWL_DEFAULT_LIMITS", "4/s,8")
        reset_settings()
        reset_gate()
        gate = get_gate()
        assert isinstance(gate, RedisGate) and gate.limits["*"].max == 8
    finally:
        monkeypatch.undo()
        reset_settings()
        reset_gate()


@pytest.mark.integration
def test_workers_obey_the_default_for_a_site_without_limits(start_workers,
                                                            sched_site: SchedSite) -> None:  # fmt: skip
    """No CHAINCRAWL_LIMITS at all, default `10/s,3`: two workers with 16 slots keep the site
    at 3 in flight and at most 10 requests a second."""
    start_workers(2, concurrency=8, CHAINCRAWL_DEFAULT_LIMITS="10/s,3", CHAINCRAWL_GATE_RETRY="0.2")
    assert get_settings().limits == ""
    slow, fast = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    run = chains.run(Chain("cap", step("sched.local.slow")),
                     [{"tag": slow, "n": i, "s": 0.4} for i in range(12)])  # fmt: skip
    p = wait_done(run, 40)
    assert p.totals["succeeded"] == 12 and p.totals["failed"] == 0
    run = chains.run(Chain("rate", step("sched.local.ping")),
                     [{"tag": fast, "n": i} for i in range(40)])  # fmt: skip
    p = wait_done(run, 40)
    assert p.totals["succeeded"] == 40 and p.totals["failed"] == 0
    stamps = sorted(h.t for h in sched_site.tagged(fast))
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    print(f"\nmax in flight {sched_site.max_in_flight[slow]} (default cap 3); "
          f"{rate:.1f} req/s (default 10/s)")  # fmt: skip
    assert sched_site.max_in_flight[slow] == 3
    assert rate <= 11.0
