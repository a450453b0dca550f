"""Each site's render scope (`<site>.render`) against a real Redis: the default cap from
CHAINCRAWL_BROWSER_SITE_LIMIT, an own CHAINCRAWL_LIMITS entry, places shared by every gate (as
by every worker), a full cap waited for then re-queued, leases that expire, rates."""

from __future__ import annotations

import threading
import time

import pytest

from config import Settings, reset_settings
from exceptions import ConfigError, Throttled
from scheduling.gate import RENDER, NoopGate, RedisGate, get_gate, politeness_report, reset_gate
from scheduling.limits import Limit, parse_limits, render_limit
from settings.browser import BrowserSettings


@pytest.fixture
def make_gate(redis_url: str, key_prefix: str, new_client):
    """make_gate(limits, render): a gate with a client of its own, on one Redis and on a
    Redis Cluster (`new_client`)."""
    settings = Settings(redis_url=redis_url, key_prefix=key_prefix)

    def make(limits: str = "", render: str | None = "2", **kw) -> RedisGate:
        default = render_limit(BrowserSettings(site_limit=render)) if render else None
        return RedisGate(parse_limits(limits), settings=settings, client=new_client(),
                         render=default, max_sleep=kw.pop("max_sleep", 0.3),
                         retry=kw.pop("retry", 0.1), **kw)  # fmt: skip

    return make


def test_the_default_cap_applies_to_every_site_and_an_own_entry_wins(make_gate) -> None:
    g = make_gate("shop.render=1", render="2")
    assert g.work_scope("demo", RENDER) == Limit(scope="demo.render", max=2)
    assert g.work_scope("shop", RENDER) == Limit(scope="shop.render", max=1)
    assert make_gate(render=None).work_scope("demo", RENDER) is None
    assert g.work_scope("demo", "other") is None  # only renders have a default


def test_places_are_shared_by_every_gate_and_given_back(make_gate, monkeypatch) -> None:
    a, b = make_gate(), make_gate()  # two workers
    held = [a.enter("demo", RENDER, ttl=30), b.enter("demo", RENDER, ttl=30)]
    assert all(held) and held[0] != held[1]
    asks: list[int] = []
    sleeps: list[float] = []
    admit, sleep = a._admit, time.sleep
    monkeypatch.setattr(a, "_admit", lambda **kw: asks.append(1) or admit(**kw))  # type: ignore[func-returns-value]
    monkeypatch.setattr(time, "sleep", lambda s: sleeps.append(s) or sleep(s))  # type: ignore[func-returns-value]
    with pytest.raises(Throttled, match=r"demo\.render: 2 in flight") as exc:
        a.enter("demo", RENDER, ttl=30)
    # asked again while the waits fit in max_sleep (0.3 s), then re-queued, never slept past it
    assert len(asks) >= 2 and len(sleeps) == len(asks) - 1
    assert 0 < sum(sleeps) <= a.max_sleep
    assert exc.value.retry_after > 0
    monkeypatch.undo()
    assert b.enter("shop", RENDER, ttl=30)  # another site has places of its own
    a.leave("demo", RENDER, held[0])
    assert b.enter("demo", RENDER, ttl=30)


def test_a_full_cap_is_waited_for_when_a_place_frees_within_max_sleep(make_gate) -> None:
    g = make_gate(render="1", max_sleep=60.0)  # however late the timer fires on a busy machine
    first = g.enter("demo", RENDER, ttl=30)
    threading.Timer(0.3, g.leave, args=("demo", RENDER, first)).start()
    t0 = time.monotonic()
    assert g.enter("demo", RENDER, ttl=30)
    assert time.monotonic() - t0 >= 0.25  # it waited for the place, not past it


def test_a_dead_holders_place_comes_back_when_its_ttl_passes(make_gate) -> None:
    g = make_gate(render="1", max_sleep=0.2)
    g.enter("demo", RENDER, ttl=3)  # never left: its worker died
    with pytest.raises(Throttled):
        g.enter("demo", RENDER, ttl=30)
    time.sleep(3.2)
    assert g.enter("demo", RENDER, ttl=30)


def test_a_render_rate_spaces_renders(make_gate) -> None:
    g = make_gate("demo.render=5/s", render=None, max_sleep=1.0)
    t0 = time.monotonic()
    holders = [g.enter("demo", RENDER, ttl=30) for _ in range(4)]
    assert time.monotonic() - t0 >= 0.55  # 4 slots 0.2 s apart
    assert all(holders)
    g.leave("demo", RENDER, holders[0])  # a rate alone holds no place: nothing to give back
    assert not [k for k in g.r.keys(f"{g.settings.key_prefix}:*") if b"leases" in k]


def test_a_render_scopes_cap_and_rate_are_shared_by_two_gates(make_gate) -> None:
    """A render scope with both a cap and a rate: one place taken with its slot through one
    gate; the other gate finds the next slot a minute away and takes no place."""
    a, b = (make_gate("demo.render=1/m,2", render=None) for _ in range(2))
    assert a.enter("demo", RENDER, ttl=30)
    with pytest.raises(Throttled, match=r"demo\.render: next slot in .* \(over its rate\)"):
        b.enter("demo", RENDER, ttl=30)
    assert a.r.zcard(a.key("demo.render", "leases")) == 1


def test_the_setting_parses_like_a_limits_entry_and_names_itself_when_wrong() -> None:
    assert render_limit(BrowserSettings(site_limit="1/s,3")) == Limit(scope="*", rate=1.0, max=3)
    assert render_limit(BrowserSettings(site_limit="off")) is None
    with pytest.raises(ConfigError, match="CHAINCRAWL_BROWSER_SITE_LIMIT"):
        render_limit(BrowserSettings(site_limit="lots"))


def test_the_render_cap_alone_picks_the_redis_gate_and_shows_in_the_report(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    for name, value in {"CHAINCRAWL_REDIS_URL": redis_url, "CHAINCRAWL_LIMITS": "",
                        "CHAINCRAWL_DEFAULT_LIMITS": "off", "CHAINCRAWL_THROTTLE": "off",
                        "CHAINCRAWL_BROWSER_SITE_LIMIT": "3"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    reset_settings()
    reset_gate()
    try:
        gate = get_gate()
        assert isinstance(gate, RedisGate)
        scope = gate.work_scope("x", RENDER)
        assert scope is not None and scope.max == 3
        assert politeness_report()["render"] == {"default": "max 3 in flight", "scopes": []}
        monkeypatch.setenv("CHAINCRAWL_BROWSER_SITE_LIMIT", "off")
        reset_settings()
        reset_gate()
        assert isinstance(get_gate(), NoopGate)
    finally:
        monkeypatch.undo()
        reset_settings()
        reset_gate()
