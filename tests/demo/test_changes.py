"""The change generator: classes, busy hours, determinism, and the server's simulated clock."""

from __future__ import annotations

import collections

import pytest
import requests

from demo.changes import DAY, ChangeModel, DemoClock, parse_classes, parse_hours
from demo.config import DemoConfig
from demo.data import BASE_TS
from demo.testing import DemoServer

CLASSES = "0.03:8/d, 0.07:2/d, 0.9:1/30d"
HOURS = "8-11,19-22"


def model(seed: int = 42) -> ChangeModel:
    return ChangeModel(seed, parse_classes(CLASSES), parse_hours(HOURS), 0.05, BASE_TS)


def test_parsing_classes_and_hours() -> None:
    assert [c.per_day for c in parse_classes("0.5:2/d, 0.5:1/12h")] == [2.0, 2.0]
    assert [c.per_day for c in parse_classes("1:1/30d")] == [pytest.approx(1 / 30)]
    assert parse_hours("8-9,20") == {8, 9, 20}
    with pytest.raises(ValueError, match="add up to 1"):
        parse_classes("0.5:2/d")
    with pytest.raises(ValueError, match=r"not like 0\.03:8/d"):
        parse_classes("hot")
    with pytest.raises(ValueError, match=r"hours are 0\.\.23"):
        parse_hours("22-25")
    with pytest.raises(ValueError, match="change_classes"):
        DemoConfig(change_classes="1:fast")


def test_posts_fall_in_their_classes_and_change_at_their_rates_and_hours() -> None:
    m = model()
    end = BASE_TS + 28 * DAY
    by_class: dict[float, list[int]] = collections.defaultdict(list)
    for n in range(1, 2001):
        by_class[m.class_of(n).per_day].append(len(m.events(n, 0, end)))
    shares = {rate: len(v) / 2000 for rate, v in by_class.items()}
    assert shares[8.0] == pytest.approx(0.03, abs=0.015)
    assert shares[2.0] == pytest.approx(0.07, abs=0.02)
    for rate, counts in by_class.items():  # events a day, over 28 days and all posts of a class
        assert sum(counts) / len(counts) / 28 == pytest.approx(rate, rel=0.25)
    hours = collections.Counter(
        int(t % DAY // 3600) for n in range(1, 300) for t in m.events(n, 0, end)
    )
    busy = sum(v for h, v in hours.items() if h in parse_hours(HOURS))
    assert busy / sum(hours.values()) > 0.85  # 8 busy hours, the others at 5 %


def test_counts_are_deterministic_and_agree_with_the_events() -> None:
    a, b = model(), model()
    hot = next(n for n in range(1, 500) if a.class_of(n).per_day == 8.0)
    for t in (BASE_TS - 10, BASE_TS + 3600 * 9.5, BASE_TS + 5 * DAY + 7, BASE_TS + 9 * DAY):
        assert a.count(hot, t) == b.count(hot, t) == len(a.events(hot, 0, t))
    assert model(seed=7).events(hot, 0, BASE_TS + 9 * DAY) != a.events(hot, 0, BASE_TS + 9 * DAY)


def test_clocks() -> None:
    c = DemoClock("manual", 100.0)
    assert (c.now(), c.advance(50), c.set(10)) == (100.0, 150.0, 10.0)
    w = DemoClock("wall", 100.0, speed=1000.0)
    assert w.now() >= 100.0
    with pytest.raises(ValueError, match="runs by itself"):
        w.set(5)


def test_the_server_moves_likes_with_its_manual_clock() -> None:
    with DemoServer(size="tiny", changes=True, change_clock="manual",
                    change_classes="1:24/d", change_hours="0-23") as demo, requests.Session() as s:  # fmt: skip

        def likes() -> int:
            return int(s.get(f"{demo.url}/h5/api/post/p1").json()["data"]["likes"])

        before = likes()
        assert s.get(f"{demo.url}/admin/clock").json() == {"now": BASE_TS, "mode": "manual"}
        assert likes() == before  # no time passed, nothing changed
        s.post(f"{demo.url}/admin/clock", json={"advance": 2 * DAY}).raise_for_status()
        truth = s.get(f"{demo.url}/admin/changes", params={"post": "p1"}).json()
        assert likes() == before + len(truth["events"]) > before  # about 48 events
        query: dict[str, str | int] = {"user_id": "u1", "size": 50}
        listed = s.get(f"{demo.url}/app/api/user_statuses", params=query,
                       headers={"User-Agent": "DemoApp/1.0 (Android 14; Pixel 8)"}).json()  # fmt: skip
        [row] = [p for p in listed["data"]["list"] if p["id"] == "p1"]
        assert row["likes"] == likes()  # list views show the same moved counts
        bad = s.post(f"{demo.url}/admin/clock", json={"later": 1})
        assert bad.status_code == 400


def test_without_changes_likes_stay_and_the_truth_is_not_served(tiny_server: DemoServer) -> None:
    r = requests.get(f"{tiny_server.url}/admin/changes", params={"post": "p1"})
    assert r.status_code == 404
