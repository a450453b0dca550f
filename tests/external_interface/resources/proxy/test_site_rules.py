"""What a site's answer says about the proxy that carried it, and how long a ban holds.

The rules these tests keep (tests/integration/test_demo_all_features.py runs every demo
feature at once):

* a 401/403 benches the proxy only when the site's rules blame the proxy: the demo's login
  wall (401) and device bans (403 `device_banned`) blame the session or device, and benching a
  healthy proxy for `ban_ttl` (an hour) for each ran the channel dry and stalled the run;
* a 429 benches the proxy for what the site said (Retry-After), not for `ban_ttl`: otherwise
  eight rate-limited proxies are gone after their first eight 429s.
"""

from __future__ import annotations

import time

import redis
import requests

import sites.demo.production.profile  # noqa: F401 - registers the demo's rules
from demo.proxy_farm import TargetSite
from exceptions import ConnectError, FetchTimeout
from external_interface.resources.base import Outcome, OutgoingRequest
from external_interface.resources.proxy import ChannelProxyProvider, ban_hold, judge_outcome
from external_interface.resources.proxy.channel import ChannelPool, channel_stats
from external_interface.resources.proxy.models import Event, ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.proxy.validate import SiteValidator
from external_interface.resources.rules import Verdict, add_rules, rule
from settings.proxy import ProxySettings
from tests.external_interface.proxy_fixtures import ProxyFactory, Task


def answer(status: int, body: str = "", retry_after: float | None = None) -> Outcome:
    return Outcome(0.01, status=status, text_sample=body, retry_after=retry_after)


def test_demo_rules_blame_the_proxy_only_for_the_rate_limit() -> None:
    blamed = {
        "429 rate_limited": answer(429, '{"error": "rate_limited", "retry_after": 0.4}'),
        "403 banned (json)": answer(403, '{"error": "banned", "message": "your IP is banned"}'),
        "403 banned (pc page)": answer(403, '<body class="page-error error-banned">'),
    }
    not_blamed = {
        "401 login wall": answer(401, '{"error": "login_required", "ok": 0}'),
        "403 device_banned": answer(403, '{"error": "device_banned", "code": 403}'),
        "403 unknown_device": answer(403, '{"error": "unknown_device", "code": 403}'),
        "403 bad_sign": answer(403, '{"error": "bad_sign", "code": 403}'),
        "403 bad_user_agent": answer(403, '<body class="page-error error-bad_user_agent">'),
    }
    for what, outcome in blamed.items():
        assert judge_outcome("demo", outcome) is Event.BANNED, what
    for what, outcome in not_blamed.items():
        assert judge_outcome("demo", outcome) is Event.NEUTRAL, what
    # without rules of its own, a site keeps the generic classification: 401/403/429 are bans
    assert judge_outcome("no-rules-site", not_blamed["403 device_banned"]) is Event.BANNED
    assert judge_outcome("demo", answer(200)) is Event.SUCCESS


def test_transport_failures_are_the_proxys_whatever_the_site_rules() -> None:
    add_rules("catch-all-site", "proxy", rule(Verdict.NEUTRAL))  # would excuse everything
    refused = Outcome(0.01, error=ConnectError("connection refused"))
    assert judge_outcome("catch-all-site", refused) is Event.DEAD
    assert (
        judge_outcome("catch-all-site", Outcome(2.0, error=FetchTimeout("slow"))) is Event.TIMEOUT
    )
    assert judge_outcome("catch-all-site", answer(403)) is Event.NEUTRAL


def test_ban_hold_follows_the_site() -> None:
    s = ProxySettings(ban_ttl=3600, throttle_ttl=45)
    assert ban_hold(answer(429, retry_after=2.0), s) == 2.0  # the Retry-After header
    assert ban_hold(answer(429, '{"retry_after": 0.75}'), s) == 0.75  # or the body says so
    assert ban_hold(answer(403, "<p>banned</p>", retry_after=30), s) == 30
    assert ban_hold(answer(429, "slow down"), s) == 45  # a 429 that says nothing
    assert ban_hold(answer(403, "go away"), s) is None  # a real ban: the channel's ban_ttl


def _provider(rds: redis.Redis, prefix: str, site: str) -> ChannelProxyProvider:
    settings = ProxySettings(ban_ttl=3600, refill_interval=0.0)
    prov = ChannelProxyProvider(site, "app", rds=rds, prefix=prefix, settings=settings)
    for port in (9001, 9002):
        prov.pool.admit(ProxyAddress.parse(f"http://127.0.0.250:{port}"), 0.01)
    return prov


def _through(prov: ChannelProxyProvider, outcome: Outcome) -> str:
    req = OutgoingRequest("GET", "http://127.0.0.1:9/app/api/detail")
    task = Task(prov.site, "app")
    prov.prepare(req, task)
    prov.feedback(req, outcome, task)
    return req.leases["proxy"]


def _server_ms(rds: redis.Redis) -> int:
    sec, usec = rds.time()
    return sec * 1000 + usec // 1000


def test_a_device_ban_leaves_the_proxy_in_the_channel(rds: redis.Redis, key_prefix: str) -> None:
    prov = _provider(rds, key_prefix, "demo")
    pid = _through(prov, answer(403, '{"error": "device_banned", "code": 403}'))
    # still in the channel (resting its 1/20 s after the use, then idle), benched nowhere
    assert pid in prov.channel.members() and prov.channel.banned() == []
    assert channel_stats(prov.channel) == {}


def test_a_429_benches_the_proxy_for_the_sites_retry_after(
    rds: redis.Redis, key_prefix: str
) -> None:
    prov = _provider(rds, key_prefix, "demo")
    pid = _through(prov, answer(429, '{"error": "rate_limited"}', retry_after=1.0))
    assert prov.channel.banned() == [pid] and pid not in prov.channel.members()
    until = rds.zscore(prov.channel.key_for("ban", pid), pid)
    assert until is not None and 0 < until - _server_ms(rds) <= 1000  # not ban_ttl's hour
    assert channel_stats(prov.channel) == {"banned": 1}
    assert prov.pool.score(pid) == 5  # the proxy's health is not in question
    # once the second is over, a refill takes it back
    deadline = time.monotonic() + 10
    while pid not in prov.channel.members():
        assert time.monotonic() < deadline, "the ban never ended"
        prov.channel.refill()
        time.sleep(0.05)


def test_a_real_ban_without_retry_after_holds_for_ban_ttl(
    rds: redis.Redis, key_prefix: str
) -> None:
    prov = _provider(rds, key_prefix, "elsewhere")
    pid = _through(prov, answer(403, "forbidden"))
    until = rds.zscore(prov.channel.key_for("ban", pid), pid)
    assert until is not None and until - _server_ms(rds) > 3500 * 1000


def test_requests_raised_errors_still_classify() -> None:
    err = requests.exceptions.ProxyError("refused")
    assert judge_outcome("demo", Outcome(0.01, error=err)) is Event.DEAD


def test_the_site_validator_follows_the_site_rules_too(
    pool: GlobalPool, proxies: ProxyFactory, target_site: TargetSite, key_prefix: str
) -> None:
    """A site whose 403 blames something else (its rule says neutral): the per-site check of a
    proxy the target answers 403 must not bench it; without the rule it does."""
    excused, strict = f"excused-{key_prefix}", f"strict-{key_prefix}"
    add_rules(excused, "proxy", rule(Verdict.NEUTRAL, {403}))
    [p] = proxies.healthy(1)
    pool.admit(ProxyAddress.parse(p.url), 0.1)
    for site in (excused, strict):
        target_site.ban(site, p.host)
    lenient = ChannelPool(excused, pool)
    assert SiteValidator(lenient, target_site.url(f"/site/{excused}"), timeout=2).run() == {
        "checked": 1,
        "neutral": 1,
    }
    assert lenient.members() == {p.id} and lenient.banned() == []
    other = ChannelPool(strict, pool)
    assert SiteValidator(other, target_site.url(f"/site/{strict}"), timeout=2).run() == {
        "checked": 1,
        "banned": 1,
    }
    assert other.banned() == [p.id] and channel_stats(other) == {"banned": 1}
