"""utils.process: the gevent worker's page slots serve the most urgent waiter first.

gevent's greenlets and events work without monkey-patching, so these run in the test process."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from gevent import Greenlet

gevent = pytest.importorskip("gevent")

from utils.process import RankedSlots  # noqa: E402


def _waiter(slots: RankedSlots, rank: int, name: str, served: list[str]) -> Greenlet:
    def run() -> None:
        with slots.slot(rank):
            served.append(name)
            gevent.sleep(0)  # hold the slot across a switch, as a page does

    return gevent.spawn(run)


def test_free_slots_are_taken_without_waiting() -> None:
    slots = RankedSlots(2)
    slots.acquire(0)
    slots.acquire(9)
    assert (slots.free, slots.waiting) == (0, 0)
    slots.release()
    slots.release()
    assert slots.free == 2


def test_waiters_are_served_by_rank_then_in_arrival_order() -> None:
    slots = RankedSlots(1)
    served: list[str] = []
    slots.acquire()
    gs = [
        _waiter(slots, rank, name, served)
        for rank, name in [(1, "low-a"), (5, "mid-a"), (1, "low-b"), (9, "high"), (5, "mid-b")]
    ]
    gevent.sleep(0)  # all five are now queued
    assert slots.waiting == 5
    slots.release()
    gevent.joinall(gs, raise_error=True)
    assert served == ["high", "mid-a", "mid-b", "low-a", "low-b"]
    assert (slots.free, slots.waiting) == (1, 0)


def test_a_released_slot_is_not_taken_by_a_newcomer() -> None:
    """The slot passes to the waiter at release, before it runs again: an acquire in between
    (even a more urgent one) queues behind it instead of taking the slot."""
    slots = RankedSlots(1)
    served: list[str] = []
    slots.acquire()
    first = _waiter(slots, 0, "waited", served)
    gevent.sleep(0)
    slots.release()  # passes to `first`, which has not run yet
    assert slots.free == 0
    late = _waiter(slots, 9, "newcomer", served)
    gevent.joinall([first, late], raise_error=True)
    assert served == ["waited", "newcomer"]
    assert slots.free == 1


@pytest.mark.parametrize("when", ["while waiting", "after its slot was passed"])
def test_a_killed_waiter_leaves_no_slot_behind(when: str) -> None:
    """Killed while waiting, a waiter leaves the queue; killed after the slot passed to it
    (the kill delivered before the hand-over wakes it), it passes the slot on."""
    slots = RankedSlots(1)
    served: list[str] = []
    slots.acquire()
    doomed = _waiter(slots, 9, "doomed", served)
    other = _waiter(slots, 1, "other", served)
    gevent.sleep(0)
    if when == "while waiting":
        doomed.kill()
        assert slots.waiting == 1
        slots.release()
    else:
        doomed.kill(block=False)
        slots.release()  # passes to doomed, which the kill reaches first
    other.join()
    assert doomed.dead
    assert served == ["other"]
    assert (slots.free, slots.waiting) == (1, 0)


def test_bad_sizes_and_extra_releases_are_errors() -> None:
    with pytest.raises(ValueError, match="at least one slot, got 0"):
        RankedSlots(0)
    slots = RankedSlots(1)
    with pytest.raises(ValueError, match="released more often than acquired"):
        slots.release()


def test_a_pages_rank_is_its_runs_priority_or_the_default() -> None:
    from config import get_settings
    from lifecycle import runtime

    page_rank = runtime.current().page_rank
    default = get_settings().default_priority
    assert page_rank({"prio": 9}) == 9
    assert page_rank({"prio": "2"}) == 2
    assert page_rank({}) == page_rank(None) == default
    assert page_rank({"prio": "urgent"}) == page_rank({"prio": None}) == default


def test_a_waiter_that_times_out_gets_nothing_and_leaves_no_trace() -> None:
    """The fetch slots' deadline: a request that waits past its timeout gives up cleanly."""
    slots = RankedSlots(1)
    assert slots.acquire(0, timeout=0) is True
    assert slots.acquire(9, timeout=0.05) is False
    assert (slots.free, slots.waiting) == (0, 0)
    served: list[str] = []
    late = _waiter(slots, 1, "late", served)
    gevent.sleep(0)
    slots.release()  # straight to the one still waiting, not to the one that gave up
    late.join(timeout=1)
    assert served == ["late"] and slots.free == 1


def test_a_waiter_served_before_its_timeout_keeps_the_slot() -> None:
    slots = RankedSlots(1)
    slots.acquire()
    got: list[bool] = []
    g = gevent.spawn(lambda: got.append(slots.acquire(5, timeout=1)))
    gevent.sleep(0.01)
    slots.release()
    g.join(timeout=1)
    assert got == [True] and (slots.free, slots.waiting) == (0, 0)
    slots.release()
    assert slots.free == 1


def test_pass_on_lets_the_waiter_run_before_the_releaser_goes_on() -> None:
    """A fetch slot given back with `pass_on` goes to the waiter, which runs (sends its
    request) before the releaser parses its response; with nobody waiting nothing yields."""
    slots = RankedSlots(1)
    order: list[str] = []
    slots.acquire()
    g = _waiter(slots, 0, "waiter", order)
    gevent.sleep(0)  # queued
    slots.pass_on()
    order.append("releaser")
    g.join()
    assert order == ["waiter", "releaser"]
    slots.acquire()
    later = gevent.spawn(order.append, "spawned")
    slots.pass_on()  # nobody waits: no switch, the spawned greenlet has not run yet
    assert order == ["waiter", "releaser"] and slots.free == 1
    later.join()
