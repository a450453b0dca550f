"""The report's time series: one sampler per interval across processes, bounded lists, and
window numbers that are differences between the totals now and the point before the window."""

from __future__ import annotations

from typing import Any

import pytest

from config import Settings
from monitor import timeseries
from monitor.report import gather, parse_since
from settings.monitor import reset_monitor_settings
from tests.conditions import wait_for
from tests.monitor.conftest import record
from utils import environ, process
from utils.keyspace import Keyspace


@pytest.fixture
def small_series() -> Any:
    saved = environ.apply({"CHAINCRAWL_MONITOR_SERIES_POINTS": "3"})
    reset_monitor_settings()
    yield
    environ.restore(saved)
    reset_monitor_settings()


def test_one_process_samples_an_interval_and_the_series_stay_bounded(
    rds: Any, mon: Settings, small_series: Any
) -> None:
    ks = Keyspace(mon.key_prefix)
    rds.sadd(ks.active_runs, "r1")
    a, b = timeseries.Sampler(rds, mon, 60), timeseries.Sampler(rds, mon, 60)
    for i in range(5):
        rds.hset(ks.counters("r1"), mapping={"succeeded": i, "items": 2 * i, "h5.feed:items": 1})
        assert a.tick(now=1000.0 + i) is True
        assert b.tick(now=1000.0 + i) is False  # the other process sampled this interval
        rds.delete(mon.key("series", "lock"))
    points = timeseries.read(rds, timeseries.run_series_key(mon, "r1"))
    assert [(p["t"], p["c"]) for p in points] == [
        (1002.0, {"succeeded": 2, "items": 4}), (1003.0, {"succeeded": 3, "items": 6}),
        (1004.0, {"succeeded": 4, "items": 8}),
    ]  # fmt: skip
    assert len(timeseries.read(rds, timeseries.fleet_key(mon))) == 3
    assert 0 < rds.ttl(timeseries.run_series_key(mon, "r1")) <= mon.run_retention


def test_window_numbers_are_the_growth_since_the_point_before_the_window(
    rds: Any, mon: Settings
) -> None:
    record(rds, mon, "shop.pc.list", ok=5, retried=2)
    timeseries.sample(rds, mon, now=1000.0)  # before the window
    record(rds, mon, "shop.pc.list", ok=1, retried=3, error="TruncatedResponse")
    data = gather(rds, mon, since=60, now=1100.0)
    assert data["window"]["fleet_window"] is True
    # the 2 ServerErrors came before the window: only the 3 after it count
    assert [(e["type"], e["n"]) for e in data["errors"]] == [("TruncatedResponse", 3)]
    # a window reaching past the oldest point: the totals since the counters began, said so
    data = gather(rds, mon, since=10_000, now=1100.0)
    assert data["window"]["fleet_window"] is False
    assert sorted((e["type"], e["n"]) for e in data["errors"]) == [
        ("ServerError", 2), ("TruncatedResponse", 3)
    ]  # fmt: skip


def test_since_reads_durations() -> None:
    assert [parse_since(x) for x in ("90m", "24h", "7d", "30", "1.5h")] == [
        5400, 86400, 604800, 30, 5400
    ]  # fmt: skip
    with pytest.raises(ValueError, match="expected a duration"):
        parse_since("yesterday")


def test_an_idle_processs_sampler_backs_off_and_samples_at_the_first_task(
    rds: Any, mon: Settings
) -> None:
    """No task started since the last try: the wait doubles up to `idle_max`; the first task
    to start ends a longer wait at once (a point at the start of the work), and the tries
    are back to every interval."""
    s = timeseries.Sampler(rds, mon, interval=60, idle_max=600)
    assert [s.next_wait() for _ in range(5)] == [120, 240, 480, 600, 600]
    process.note_work()
    assert s.next_wait() == 60
    assert s.next_wait() == 120

    s = timeseries.Sampler(rds, mon, interval=1, idle_max=600)
    tries: list[bool] = []
    tick = s.tick

    def counted(now: float | None = None) -> bool:
        tries.append(tick(now))
        return tries[-1]

    s.tick = counted  # type: ignore[method-assign]
    s.start_thread()
    try:
        wait_for(lambda: s.wait >= 4, 30, "backed off")
        done = len(tries)
        rds.delete(mon.key("series", "lock"))  # the last try's lock: not what is shown here
        process.note_work()  # the wait under way is 4 s or more
        wait_for(lambda: len(tries) > done, 3, "a try at the first task")
        assert tries[done] is True
        # a task started since the last try: every interval again (then doubling)
        wait_for(lambda: s.wait <= 2, 5, "back to the interval")
    finally:
        s.stop()
