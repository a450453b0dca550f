"""A proxy's rest after each request (1 / the site's per-IP rate), the in-process wait for a
proxy held in the process (first come first served, handed over at its return, no Redis
polling), the retry given back (the soonest return known), and a drained pool's sub-pools
asked one at a time. Real Redis (the session's server); no assertion on sub-second timing."""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from exceptions import ResourceUnavailable
from external_interface.resources import holding
from external_interface.resources.base import OutgoingRequest
from external_interface.resources.lease import KNOWN_FOR, LeasePool
from external_interface.resources.pool import configure_pool
from external_interface.resources.proxy.channel import ChannelPool, ProxyLease
from external_interface.resources.proxy.models import Event, ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.proxy.provider import NO_PROXY_WAIT, ChannelProxyProvider
from settings.proxy import ProxySettings
from tests.conditions import wait_for
from tests.external_interface.proxy_fixtures import Task
from tests.external_interface.stores import let_time_pass


@pytest.fixture
def held() -> Any:
    holding.set_enabled(True)  # the directory's conftest turns it off for the engine's tests
    holding.forget()
    yield
    holding.forget()


def site(**cfg: Any) -> str:
    """A site of its own with these proxy pool settings (`configure_pool("proxy", site)`)."""
    name = f"s{uuid.uuid4().hex[:8]}"
    configure_pool("proxy", name, **cfg)
    return name


def fill(pool: GlobalPool, n: int) -> list[str]:
    ids = [f"10.30.0.{i + 1}:3128" for i in range(n)]
    for pid in ids:
        pool.admit(ProxyAddress.parse(pid), elapsed=0.05)
        pool.rds.zadd(pool.keys.score, {pid: 8.0})
    return ids


def gpool(rds: redis.Redis, prefix: str) -> GlobalPool:
    return GlobalPool(rds, prefix, ProxySettings(refill_interval=0.0))


Channel = Callable[..., ChannelPool]


@pytest.fixture
def channel(rds: redis.Redis, key_prefix: str) -> Channel:
    """`channel(proxies=1, parts=1, held=False, **cfg)`: the channel of a site of its own
    with these pool settings, over the test's pool filled with `proxies` (`ch.pool`, `ch.site`)."""

    def make(proxies: int = 1, parts: int = 1, held: bool = False, **cfg: Any) -> ChannelPool:
        pool = gpool(rds, key_prefix)
        fill(pool, proxies)
        return ChannelPool(site(**cfg), pool, held=held, parts=parts)

    return make


def holding_of(ch: ChannelPool) -> holding.Holding:
    h = ch.holding()
    assert h is not None
    return h


# --- the rest ---------------------------------------------------------------------------------


def test_a_returned_proxy_rests_in_the_channel_then_comes_back_with_no_use_counted(
    rds: redis.Redis, channel: Channel
) -> None:
    """Not held: the return itself rests the proxy (in :lease, without a token) for the site's
    cooldown; nothing lends it meanwhile, and it is back by itself afterwards, its count the
    one request it served (no lost lease counted, nothing reclaimed)."""
    ch = channel(cooldown=30)
    lease = ch.checkout()
    assert lease is not None and ch.release(lease) == "returned"
    x = lease.id
    assert ch.checkout() is None and ch.idle() == [] and x in ch.members()
    assert ch.renew(lease) is False  # a resting proxy is nobody's lease
    let_time_pass(rds, ch, 31)
    again = ch.checkout()
    assert again is not None and again.id == x and again.uses == 1
    assert ch.counters().get("reclaimed", 0) == 0


def test_a_resting_proxy_can_still_be_banned(channel: Channel) -> None:
    ch = channel(cooldown=30)
    lease = ch.checkout()
    assert lease is not None
    x = lease.id
    ch.release(lease)
    assert ch.release(lease, Event.BANNED, ban_ttl=60) == "dropped"  # a late ban still counts
    assert x not in ch.members() and ch.banned() == [x] and ch.lent() == []


def test_a_held_proxy_rests_in_the_holding_and_the_provider_retries_when_it_is_ready(
    rds: redis.Redis, key_prefix: str, held: None
) -> None:
    """Held: the proxy rests in the process; a request meanwhile is told to come back when
    its rest ends (the soonest return known), not after a fixed 2 s."""
    name = site(cooldown=1.5, hold_requests=4, hold_seconds=10, hold_idle=10, hold_wait=0)
    prov = ChannelProxyProvider(name, rds=rds, prefix=key_prefix, settings=ProxySettings())
    fill(prov.pool, 1)
    lease, wait = prov.channel.lend()
    assert lease is not None and wait is None
    prov.channel.release(lease)
    none, wait = prov.channel.lend()
    assert none is None and wait is not None and 1.0 < wait <= 1.5
    with pytest.raises(ResourceUnavailable) as err:
        prov.prepare(OutgoingRequest("GET", "http://127.0.0.1:9/x"), Task(name, ""))
    assert err.value.retry_after is not None and 0.5 < err.value.retry_after <= 1.5


def test_with_nothing_known_the_retry_is_the_fixed_one(
    rds: redis.Redis, key_prefix: str, held: None
) -> None:
    name = site(hold_requests=4, hold_seconds=10, hold_idle=10, hold_wait=0)
    prov = ChannelProxyProvider(name, rds=rds, prefix=key_prefix, settings=ProxySettings())
    with pytest.raises(ResourceUnavailable) as err:  # no proxy at all
        prov.prepare(OutgoingRequest("GET", "http://127.0.0.1:9/x"), Task(name, ""))
    assert err.value.retry_after == NO_PROXY_WAIT


def test_a_bench_s_end_is_a_known_return(channel: Channel) -> None:
    """The only proxy benched by the site for 1.5 s: the next request is told to come back
    then (the refill takes it back after the bench)."""
    ch = channel()
    lease = ch.checkout()
    assert lease is not None
    ch.release(lease, Event.BANNED, ban_ttl=1.5)
    none, wait = ch.lend()
    assert none is None and wait is not None and 0.5 < wait <= 1.5


# --- the in-process wait ----------------------------------------------------------------------


def test_waiting_takes_are_served_first_come_first_served_without_redis(
    channel: Channel, held: None
) -> None:
    """One proxy, held here and in use; three more requests wait in the process. Each return
    hands the proxy to the longest waiting (after its rest); the waits cost no Redis call."""
    ch = channel(
        held=True, cooldown=0.01, hold_requests=8, hold_seconds=20, hold_idle=10, hold_wait=20
    )
    first = ch.checkout()
    assert first is not None
    h = holding_of(ch)
    calls = h.calls
    order: list[int] = []
    got: dict[int, ProxyLease] = {}
    lock = threading.Lock()

    def wait_for_one(i: int) -> None:
        lease = ch.checkout()
        assert lease is not None
        with lock:
            order.append(i)
            got[i] = lease

    threads = []
    for i in range(3):  # one after the other in the queue
        t = threading.Thread(target=wait_for_one, args=(i,))
        t.start()
        threads.append(t)
        wait_for(functools.partial(lambda n: h.waited == n, i + 1), 5, f"waiter {i} queued")
    ch.release(first)
    for i in range(3):
        wait_for(functools.partial(got.__contains__, i), 5, f"waiter {i} served")
        ch.release(got[i])
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2] and h.handed == 3
    assert all(lease.id == first.id for lease in got.values())
    # the waiting takes asked Redis once between them (the empty channel, then believed)
    assert h.calls - calls <= 1


def test_a_proxy_that_goes_back_to_the_channel_wakes_the_first_waiting_take(
    channel: Channel, held: None
) -> None:
    """The held proxy reaches its request bound at its return: it goes back to the channel,
    and the waiting take asks the channel once and gets it from there."""
    ch = channel(held=True, hold_requests=2, hold_seconds=20, hold_idle=10, hold_wait=20)
    first = ch.checkout()
    assert first is not None
    ch.release(first)  # one request served, still held
    second = ch.checkout()
    assert second is not None and second.id == first.id
    h = holding_of(ch)
    got: list[ProxyLease | None] = []
    t = threading.Thread(target=lambda: got.append(ch.checkout()))
    t.start()
    wait_for(lambda: h.waited == 1, 5, "the take waiting")
    ch.release(second)  # its second request: back to the channel
    t.join(5)
    assert got and got[0] is not None and got[0].id == first.id and h.handed == 0
    assert ch.lent() == [first.id]  # lent from the channel again, to the waiting take


def test_a_take_does_not_wait_for_a_proxy_it_avoids_nor_when_nothing_is_held(
    rds: redis.Redis, key_prefix: str, channel: Channel, held: None
) -> None:
    ch = channel(held=True, hold_requests=8, hold_seconds=20, hold_idle=10, hold_wait=20)
    first = ch.checkout()
    assert first is not None
    h = holding_of(ch)
    assert ch.lend(avoid=[first.id])[0] is None  # the one in use is avoided: no wait for it
    assert h.waited == 0
    other = ChannelPool(
        site(hold_requests=8, hold_wait=20), gpool(rds, f"{key_prefix}:o"), held=True
    )
    assert other.checkout() is None and holding_of(other).waited == 0


def test_a_crashed_holder_s_proxy_still_comes_back_by_expiry(
    rds: redis.Redis, channel: Channel, held: None
) -> None:
    """The holding (and its waiting takes) gone with its process: the proxy's lease expires
    and the channel lends it again."""
    ch = channel(held=True, cooldown=0.01, hold_requests=8, hold_seconds=20, hold_idle=10)
    lease = ch.checkout(lease_ttl=60)
    assert lease is not None
    holding.forget()  # the process died: nothing returns it
    fresh = ChannelPool(ch.site, ch.pool, parts=1)
    assert fresh.checkout() is None
    let_time_pass(rds, fresh, 61)
    again = fresh.checkout()
    assert again is not None and again.id == lease.id


# --- sub-pools found empty ----------------------------------------------------------------------


def counting(pool: LeasePool) -> list[int]:
    """The parts each of `pool`'s checkout calls asked."""
    asked: list[int] = []
    run = pool._run

    def spy(op: str, args: Any = (), keys: Any = None, part: int = 0) -> Any:
        if op == "checkout":
            asked.append(part)
        return run(op, args, keys, part)

    pool._run = spy  # type: ignore[method-assign]
    return asked


def test_a_drained_pool_asks_one_sub_pool_for_a_second(channel: Channel) -> None:
    """Three parts, every member lent: the checkout that finds them all empty asks each; for
    a second after, a checkout asks one (in turn); then each again."""
    ch = channel(proxies=3, parts=3)
    leases = [ch.checkout() for _ in range(3)]
    assert all(leases)
    asked = counting(ch)
    assert ch.take((), 10, fallback=False).lease is None
    assert sorted(asked) == [0, 1, 2]
    asked.clear()
    for _ in range(3):
        assert ch.take((), 10, fallback=False).lease is None
    assert len(asked) == 3 and sorted(asked) == [0, 1, 2]  # one a checkout, in turn
    asked.clear()
    ch.time_passed(KNOWN_FOR)
    assert ch.take((), 10, fallback=False).lease is None
    assert sorted(asked) == [0, 1, 2]


def test_a_drained_pool_asks_the_part_a_member_went_back_to(channel: Channel) -> None:
    ch = channel(proxies=3, parts=3)
    leases = [ch.checkout() for _ in range(3)]
    assert ch.take((), 10, fallback=False).lease is None  # all seen empty
    back = leases[1]
    assert back is not None
    ch.release(back)
    asked = counting(ch)
    again = ch.take((), 10, fallback=False).lease
    assert again is not None and again.id == back.id and asked == [back.part]


class Killed(BaseException):
    """A take ended while it waited (a task's time limit, a greenlet killed)."""


def test_a_take_killed_while_it_waits_loses_no_proxy(
    channel: Channel, held: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy is handed to the waiting take just as that take is killed: the proxy is
    free in the holding again, and the next request gets it from there."""
    ch = channel(held=True, hold_requests=8, hold_seconds=20, hold_idle=10, hold_wait=20)
    lent = ch.checkout()
    assert lent is not None
    first: ProxyLease = lent

    class Dying(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            ch.release(first)  # the proxy comes back, handed over...
            raise Killed  # ...and the take is killed before it uses it

    monkeypatch.setattr(holding, "_Waiter", functools.partial(holding._Waiter, event=Dying()))
    with pytest.raises(Killed):
        ch.checkout()
    h = holding_of(ch)
    assert h.handed == 1 and not h._waiters
    monkeypatch.undo()
    again = ch.lend()[0]
    assert again is not None and again.id == first.id and ch.lent() == [first.id]
