"""The watched set's history in Redis: enrolling, visits, the allowance, bought visits, drops."""

from __future__ import annotations

import pytest

from scheduling.recrawl import History, Knobs, Observer, Watch, observe_items
from scheduling.recrawl.history import MAX_MISSES, RETRY_AFTER
from scheduling.recrawl.model import DAY, HOUR
from utils.clock import SimClock

T0 = 1_800_000_000.0 - (1_800_000_000.0 % DAY)  # a midnight


def watch(budget: float = 240.0, **kw: object) -> Watch:
    knobs = Knobs(budget=budget, min_interval=60.0, max_interval=2 * DAY, **kw)  # type: ignore[arg-type]
    return Watch("posts", "demo", "demo.post", "post_id", "post_id", ("likes",), knobs)


@pytest.fixture
def hist(rds, key_prefix) -> History:
    return History(rds, key_prefix, watch())


def test_first_sight_enrolls_a_key_with_a_planned_visit(hist: History) -> None:
    res = hist.observe([("p1", False), ("p2", False)], T0)
    assert (res.enrolled, res.visits) == (2, 0)
    rec = hist.record("p1")
    assert rec is not None and (rec.n, rec.x, rec.last) == (0, 0, T0)
    due = hist.due_at("p1")
    assert due is not None and T0 + 60 <= due <= T0 + 2 * DAY
    assert hist.totals().get("keys") == 2


def test_visits_count_intervals_and_changes(hist: History) -> None:
    hist.observe([("p1", False)], T0)
    hist.observe([("p1", True)], T0 + HOUR)
    hist.observe([("p1", False)], T0 + 2 * HOUR)
    rec = hist.record("p1")
    assert rec is not None and (rec.n, rec.x) == (2, 1)
    assert rec.active == pytest.approx(2 * HOUR, rel=0.05)  # active seconds: near wall ones yet
    t = hist.totals()
    assert (t.get("visits"), t.get("changes"), t.get("n"), t.get("x")) == (2, 1, 2, 1)
    assert sum(t.get(f"e{h}") for h in range(24)) == pytest.approx(2 * HOUR)
    assert t.get("c0") + t.get("c1") == pytest.approx(1.0)  # the change, in 00:00..01:00


def test_the_same_visit_heard_twice_counts_once(hist: History) -> None:
    hist.observe([("p1", False)], T0)
    hist.observe([("p1", True), ("p1", False)], T0 + HOUR)  # a batch holding the key twice
    hist.observe([("p1", False)], T0 + HOUR + 0.2)  # a hook called again
    rec = hist.record("p1")
    assert rec is not None and (rec.n, rec.x) == (1, 1)


def test_a_key_that_changes_often_is_visited_sooner(hist: History) -> None:
    hist.observe([("hot", False), ("cold", False)], T0)
    for i in range(1, 13):
        hist.observe([("hot", True), ("cold", False)], T0 + i * HOUR)
    now = T0 + 12 * HOUR
    hot, cold = hist.due_at("hot"), hist.due_at("cold")
    assert hot is not None and cold is not None
    assert hot - now < (cold - now) / 3


def test_dispatch_spends_an_allowance_that_accrues_by_the_day(hist: History) -> None:
    hist.observe([(f"p{i}", False) for i in range(50)], T0)
    sent, _ = hist.dispatch(T0 + 3 * DAY)  # the allowance starts empty
    assert sent == []
    sent, _ = hist.dispatch(T0 + 3 * DAY + HOUR)  # 240/day = 10 an hour
    assert len(sent) == 10
    sent2, _ = hist.dispatch(T0 + 3 * DAY + HOUR + 60)
    assert sent2 == []  # a minute buys a sixth of a page
    assert hist.totals().get("dispatched") == 10
    due = hist.due_at(sent[0])
    assert due is not None and due >= T0 + 3 * DAY + HOUR + RETRY_AFTER  # not sent twice


def test_a_visit_the_scheduler_sent_is_bought_and_its_change_found(hist: History) -> None:
    hist.observe([("p1", False), ("p2", False)], T0)
    hist.dispatch(T0 + 3 * DAY - HOUR)
    sent, _ = hist.dispatch(T0 + 3 * DAY)
    assert sorted(sent) == ["p1", "p2"]
    hist.observe([("p1", True), ("p2", False)], T0 + 3 * DAY + 10)
    hist.observe([("p3", False)], T0 + 3 * DAY + 10)  # a key some other run stored
    s = hist.summary(T0 + 3 * DAY + 20)
    assert s["last_day"] == {"visits": 2, "changes": 1, "bought": 2, "found": 1}
    assert s["total"]["dispatched"] == 2 and s["keys"] == 3 and s["in_flight"] == 0


def test_a_key_sent_again_and_again_without_being_stored_is_dropped(hist: History) -> None:
    hist.observe([("gone", False)], T0)
    t = T0 + 3 * DAY
    hist.dispatch(t - HOUR)
    dropped: list[str] = []
    for i in range(MAX_MISSES + 1):
        sent, dropped = hist.dispatch(t + i * (RETRY_AFTER + 60))
        if dropped:
            break
        assert sent == ["gone"]
    assert dropped == ["gone"]
    assert hist.record("gone") is None and hist.due_at("gone") is None
    assert hist.totals().get("keys") == 0


def test_a_batch_whose_key_moved_meanwhile_is_computed_again(hist: History, rds) -> None:
    hist.observe([("p1", False)], T0)
    real = rds.hmget
    calls: list[int] = []

    def racing(key, keys):  # another drainer observes p1 between our read and our write
        got = real(key, keys)
        if not calls:
            calls.append(1)
            History(rds, hist.k_records.split(":recrawl:")[0], hist.watch).observe(
                [("p1", True)], T0 + HOUR
            )
        return got

    rds.hmget = racing
    try:
        hist.observe([("p1", False)], T0 + 2 * HOUR)
    finally:
        rds.hmget = real
    rec = hist.record("p1")
    assert rec is not None and (rec.n, rec.x) == (2, 1)  # both visits counted, neither lost


def test_observe_items_judges_values_with_the_dedup_store(rds, key_prefix) -> None:
    w = watch()
    items = [{"post_id": "p1", "likes": 3, "title": "a"}, {"post_id": "p2", "likes": 5}]
    observe_items(rds, key_prefix, w, items, T0)
    observe_items(rds, key_prefix, w, [{"post_id": "p1", "likes": 4, "title": "a"},
                                       {"post_id": "p2", "likes": 5, "title": "b"}], T0 + HOUR)  # fmt: skip
    h = History(rds, key_prefix, w)
    assert (h.record("p1").x, h.record("p2").x) == (1, 0)  # type: ignore[union-attr]  # likes only


def test_the_observer_hook_reads_the_watches_published(rds, key_prefix) -> None:
    clock = SimClock(rds, f"{key_prefix}:clock")
    clock.set(T0)
    obs = Observer(rds, key_prefix, clock, refresh=0.01)
    obs.hook("demo.post", [{"post_id": "p1", "likes": 1}])
    h = History(rds, key_prefix, watch())
    assert h.record("p1") is None  # nobody published the watch yet
    h.publish()
    obs._read_at = None
    obs.hook("demo.post", [{"post_id": "p1", "likes": 1}])
    obs.hook("demo.user", [{"post_id": "p9"}])  # not watched
    assert h.record("p1") is not None and h.record("p9") is None


def test_a_watch_whose_keys_are_lost_skips_its_batches_with_one_line(
    rds, key_prefix, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A watched set whose keys are on a lost slot range: its batches are not observed (the
    hook raised, and the drainer held back every run's items of the type, whatever their
    slots), one line says so, one when they are observed again."""
    import redis

    import scheduling.recrawl.observe as observe
    from utils.slots import LostRange

    lost = [LostRange(0, 5460, "127.0.0.1:17101", ("127.0.0.1:17104",))]
    ws = observe.WatchStores(rds, key_prefix, watch())
    refused = redis.ConnectionError("Error 111 connecting to 127.0.0.1:17101. Refused.")

    def down(*a: object, **kw: object) -> None:
        raise refused

    monkeypatch.setattr(observe, "lost_now", lambda client, exc: lost if exc is refused else [])
    monkeypatch.setattr(ws.dedup, "mark_many", down)
    caplog.set_level("WARNING", logger="chaincrawl.recrawl")
    for _ in range(5):
        assert ws.observe([{"post_id": "p1", "likes": 1}], T0) == observe.Observed()
    monkeypatch.undo()
    res = ws.observe([{"post_id": "p1", "likes": 1}], T0)
    assert res.enrolled == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "chaincrawl.recrawl"]
    assert len(lines) == 2, lines
    assert "slots 0-5460 lost: 127.0.0.1:17101 and its replica 127.0.0.1:17104" in lines[0]
    assert "observed again (5 batch(es) skipped)" in lines[1]
    # another error (no range lost) is raised as before: the drainer retries the batch
    monkeypatch.setattr(observe, "lost_now", lambda client, exc: [])
    monkeypatch.setattr(ws.dedup, "mark_many", down)
    with pytest.raises(redis.ConnectionError):
        ws.observe([{"post_id": "p2", "likes": 1}], T0)
