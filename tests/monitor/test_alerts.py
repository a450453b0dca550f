"""Alert rules fire a webhook and a log line once per incident, and notice recovery."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from config import ROOT, Settings
from monitor import health
from monitor import status as st
from monitor.alerts import (
    AlertConfig,
    Evaluator,
    Rule,
    Transition,
    duration,
    firing,
    history,
    load_config,
    parse_config,
)
from monitor.deadletter import DeadLetter, DeadLetterStore
from settings.monitor import AlertSettings
from tests.monitor.conftest import record
from utils.logsafe import RedactingFilter
from utils.redis import cluster_client

TASK = "shop.web.listing"


def evaluator(rds, mon, receiver, *rules: dict, ping=None, interval: float = 10.0) -> Evaluator:
    cfg = parse_config({"rules": list(rules), "interval": interval})
    cfg.webhook = receiver.url if receiver else ""
    return Evaluator(rds, cfg, mon, ping=ping)


def forced(ev: Evaluator, now: float) -> list[Transition]:
    """`ev.tick(now=now, force=True)`: a forced tick takes no lock, so it never returns None."""
    got = ev.tick(now=now, force=True)
    assert got is not None
    return got


FAIL_RULE = {"name": "failing", "kind": "failure_rate", "window": "60s", "above": 0.2,
             "min_events": 5, "severity": "critical"}  # fmt: skip


def test_failure_rate_fires_once_and_recovers_once(rds, mon, receiver, caplog) -> None:
    ev = evaluator(rds, mon, receiver, FAIL_RULE)
    caplog.set_level(logging.WARNING, logger="chaincrawl.alerts")
    assert ev.tick(now=1000.0, force=True) == []  # first sample: no window yet
    record(rds, mon, TASK, ok=2, failed=10)
    record(rds, mon, "shop.web.detail", ok=50)
    [t] = forced(ev, 1010.0)
    assert (t.rule, t.subject, t.action) == ("failing", TASK, "fire")
    assert [b["status"] for b in receiver.bodies] == ["firing"]
    fired = receiver.bodies[0]
    assert (
        fired["rule"] == "failing" and fired["subject"] == TASK and fired["severity"] == "critical"
    )
    assert fired["value"] == pytest.approx(10 / 12) and fired["threshold"] == {"above": 0.2}
    assert "failure rate of shop.web.listing" in fired["summary"] and "83%" in fired["summary"]
    assert [a["subject"] for a in firing(rds, mon)] == [TASK]

    # still failing (or no new data): no second notice for the same incident
    assert ev.tick(now=1020.0, force=True) == []
    record(rds, mon, TASK, failed=5)
    assert ev.tick(now=1030.0, force=True) == []
    assert len(receiver.bodies) == 1

    record(rds, mon, TASK, ok=100)
    [t] = forced(ev, 1100.0)
    assert t.action == "resolve"
    assert [b["status"] for b in receiver.bodies] == ["firing", "resolved"]
    resolved = receiver.bodies[1]
    assert resolved["incident"] == fired["incident"] and resolved["value"] == 0
    assert resolved["duration"] == pytest.approx(90.0) and "recovered" in resolved["summary"]
    assert firing(rds, mon) == []
    assert [h["status"] for h in history(rds, mon)] == ["resolved", "firing"]
    logged = [r.getMessage() for r in caplog.records]
    assert sum("ALERT FIRING" in m for m in logged) == 1
    assert sum("ALERT RESOLVED" in m for m in logged) == 1


def test_too_few_events_are_not_judged(rds, mon, receiver) -> None:
    ev = evaluator(rds, mon, receiver, FAIL_RULE)
    ev.tick(now=1000.0, force=True)
    record(rds, mon, TASK, failed=4)  # 100% failures, but below min_events=5
    assert ev.tick(now=1010.0, force=True) == []
    assert receiver.bodies == []


def test_by_site_sums_the_sites_tasks(rds, mon, receiver) -> None:
    ev = evaluator(rds, mon, receiver, {**FAIL_RULE, "by": "site"})
    ev.tick(now=1000.0, force=True)
    record(rds, mon, "shop.web.a", ok=3, failed=2)
    record(rds, mon, "shop.web.b", ok=3, failed=2)
    record(rds, mon, "other.web.a", ok=10)
    [t] = forced(ev, 1010.0)
    assert t.subject == "shop" and t.value == pytest.approx(0.4)


def test_pool_empty_must_hold_for_its_duration(rds, mon, receiver) -> None:
    ev = evaluator(rds, mon, receiver, {"name": "pool_empty", "kind": "pool_size", "below": 1,
                                        "for": "30s", "match": "cookie:*"})  # fmt: skip
    health.report(rds, health.PoolHealth("cookie:shop", size=0, bans=9, produced=20), mon)
    health.report(rds, health.PoolHealth("device:shop", size=0), mon)  # not matched
    assert ev.tick(now=1000.0, force=True) == []
    assert firing(rds, mon, include_pending=True)[0]["state"] == "pending"
    assert ev.tick(now=1020.0, force=True) == []
    [t] = forced(ev, 1031.0)
    assert (t.subject, t.action) == ("cookie:shop", "fire")
    assert receiver.bodies[0]["started_at"] == 1000.0 and receiver.bodies[0]["fired_at"] == 1031.0
    health.report(rds, health.PoolHealth("cookie:shop", size=4, produced=24), mon)
    [t] = forced(ev, 1040.0)
    assert t.action == "resolve"
    assert [b["status"] for b in receiver.bodies] == ["firing", "resolved"]


def test_a_blip_shorter_than_for_never_fires(rds, mon, receiver) -> None:
    ev = evaluator(rds, mon, receiver, {"name": "p", "kind": "pool_size", "below": 1, "for": 30})
    health.report(rds, health.PoolHealth("cookie:shop", size=0), mon)
    ev.tick(now=1000.0, force=True)
    health.report(rds, health.PoolHealth("cookie:shop", size=3), mon)
    ev.tick(now=1010.0, force=True)
    health.report(rds, health.PoolHealth("cookie:shop", size=0), mon)
    assert ev.tick(now=1035.0, force=True) == []  # pending again from 1035, not from 1000
    assert receiver.bodies == []


def test_two_monitors_never_double_fire(rds, mon, receiver) -> None:
    """Both evaluate at the same instant (lock bypassed): the Lua transition picks one."""
    rule = {"name": "pool_empty", "kind": "pool_size", "below": 1}
    evs = [evaluator(rds, mon, receiver, rule) for _ in range(4)]
    for i in range(5):
        health.report(rds, health.PoolHealth(f"cookie:s{i}", size=0), mon)
    barrier = threading.Barrier(len(evs))
    results: list = []

    def go(ev: Evaluator) -> None:
        barrier.wait()
        results.append(ev.tick(now=1000.0, force=True))

    threads = [threading.Thread(target=go, args=(e,)) for e in evs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    fired = sorted(t.subject for r in results for t in r)
    assert fired == [f"cookie:s{i}" for i in range(5)]
    assert sorted(b["subject"] for b in receiver.bodies) == fired


@pytest.mark.integration
def test_on_a_cluster_two_monitors_fire_and_resolve_once(
    redis_cluster, redis_url, key_prefix, tmp_path, receiver
) -> None:
    """The evaluator's keys share one hash tag: its transition script (state, notices,
    history) runs on a Redis Cluster, and still queues one notice per change."""
    s = Settings(redis_url=redis_cluster.url, broker_url=redis_url, key_prefix=key_prefix,
                 var_dir=tmp_path / "var")  # fmt: skip
    r = cluster_client(redis_cluster.url)
    try:
        rule = {"name": "pool_empty", "kind": "pool_size", "below": 1}
        a, b = evaluator(r, s, receiver, rule), evaluator(r, s, receiver, rule)
        health.report(r, health.PoolHealth("cookie:shop", size=0), s)
        assert [t.action for t in forced(a, 1000.0)] == ["fire"]
        assert b.tick(now=1000.0, force=True) == []  # already firing: nothing new
        health.report(r, health.PoolHealth("cookie:shop", size=2), s)
        assert [t.action for t in forced(b, 1010.0)] == ["resolve"]
        assert [x["status"] for x in receiver.bodies] == ["firing", "resolved"]
        assert [h["status"] for h in history(r, s)] == ["resolved", "firing"]
        assert firing(r, s) == []
    finally:
        r.close()


def test_the_tick_lock_lets_one_monitor_evaluate_per_interval(rds, mon, receiver) -> None:
    a = evaluator(rds, mon, receiver, FAIL_RULE, interval=30)
    b = evaluator(rds, mon, receiver, FAIL_RULE, interval=30)
    assert a.tick() is not None
    assert b.tick() is None and a.tick() is None  # the lock holds for ~0.9 interval


def test_failed_webhook_is_retried_in_order(rds, mon, receiver, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="chaincrawl.alerts")
    ev = evaluator(rds, mon, receiver, {"name": "p", "kind": "pool_size", "below": 1})
    receiver.fail_next = 2
    health.report(rds, health.PoolHealth("cookie:shop", size=0), mon)
    ev.tick(now=1000.0, force=True)  # attempt 1 fails
    health.report(rds, health.PoolHealth("cookie:shop", size=1), mon)
    ev.tick(now=1010.0, force=True)  # resolve queued behind the firing notice; attempt 2 fails
    assert receiver.bodies == []
    ev.tick(now=1020.0, force=True)  # both delivered, firing first
    assert [b["status"] for b in receiver.bodies] == ["firing", "resolved"]
    assert "attempts" not in receiver.bodies[0]
    assert any("alert webhook" in r.getMessage() for r in caplog.records)


def test_without_webhook_the_log_line_is_the_notice(rds, mon, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="chaincrawl.alerts")
    # as in a process whose handlers carry the secret-masking filter: the pool stays named
    caplog.handler.addFilter(RedactingFilter())
    ev = evaluator(rds, mon, None, {"name": "p", "kind": "pool_size", "below": 1})
    health.report(rds, health.PoolHealth("cookie:shop", size=0), mon)
    ev.tick(now=1000.0, force=True)
    assert any(
        "ALERT FIRING [p] size of pool cookie:shop is 0" in r.getMessage() for r in caplog.records
    )
    assert rds.llen(ev.k.notify) == 0


def test_workers_queue_growth_and_dead_letters(rds, mon, receiver) -> None:
    pinged: list[list[str] | None] = [["w0@host"]]
    ev = evaluator(
        rds, mon, receiver,
        {"name": "no_workers", "kind": "workers", "below": 1},
        {"name": "growing", "kind": "queue_growth", "window": 60, "above": 2, "min_depth": 3},
        {"name": "dead", "kind": "dead_letters", "window": 60, "above": 1},
        ping=lambda: pinged[0],
    )  # fmt: skip
    q = f"{mon.key_prefix}:q:shop"
    rds.rpush(q, *[b"m"] * 2)
    ev.tick(now=1000.0, force=True)
    rds.rpush(q, *[b"m"] * 4)
    pinged[0] = []
    store = DeadLetterStore(rds, mon)
    for i in range(3):
        store.add(DeadLetter(f"t{i}", TASK, {}, {}, "ServerError", "500", "", 3))
    fired = {(t.rule, t.subject) for t in forced(ev, 1010.0)}
    assert fired == {("no_workers", "workers"), ("growing", "shop"), ("dead", "deadletter")}
    pinged[0] = ["w1@host"]
    # a worker answers, the queue stopped growing, no new dead letters since 1010
    resolved = {t.rule for t in forced(ev, 1100.0) if t.action == "resolve"}
    assert resolved == {"no_workers", "growing", "dead"}


def test_a_run_that_finishes_no_task_for_too_long_fires_unless_paused(rds, mon, receiver) -> None:
    from ledger.state import RunState

    state = RunState(rds, mon)
    for rid in ("stuck", "held", "storing"):
        state.create_run(rid, "shop_chain", b"{}", 5)
        state.add_dispatched(rid, "s", 1)
        rds.hset(state.run_key(rid), "last", "50")  # its last commit, at t=50
    state.pause("held")  # idle on purpose
    rds.hset(state.counters_key("storing"), "outstanding", 0)  # only items left to store
    ev = evaluator(rds, mon, receiver, {"name": "run_stuck", "kind": "run_idle", "above": 900,
                                        "match": "shop_chain/*"})  # fmt: skip
    assert ev.tick(now=900.0, force=True) == []  # 850 s
    [t] = forced(ev, 1000.0)
    assert (t.rule, t.subject, t.action) == ("run_stuck", "shop_chain/stuck", "fire")
    assert (
        "time since run shop_chain/stuck last finished a task (s) is 950"
        in (receiver.bodies[0]["summary"])
    )
    rds.hset(state.run_key("stuck"), "last", "1005")  # it finished a task again
    [t] = forced(ev, 1010.0)
    assert (t.subject, t.action) == ("shop_chain/stuck", "resolve")


def test_a_run_the_sweeper_keeps_re_sending_without_progress_is_named(rds, mon, receiver) -> None:
    from ledger.state import RunState

    state = RunState(rds, mon)
    for rid in ("looping", "recovered"):
        state.create_run(rid, "shop_chain", b"{}", 5)
        state.add_dispatched(rid, "s", 1)
        rds.hset(state.run_key(rid), "last", "50")

    def resend(rid: str, n: int) -> None:  # what the sweeper does after a pass
        pipe = rds.pipeline()
        state.note_resends(rid, n, pipe)
        pipe.execute()

    for _ in range(3):
        resend("looping", 2)  # three passes, no commit in between
    resend("recovered", 4)
    rds.hset(state.run_key("recovered"), "last", "60")  # a commit after the re-send
    assert st.resending_runs(rds, mon) == {"shop_chain/looping": 6}
    [rec] = [r for r in st.run_records(rds, mon) if r["run_id"] == "looping"]
    assert rec["resending"] == 6
    ev = evaluator(rds, mon, receiver, {"name": "run_resending", "kind": "run_resending",
                                        "above": 5})  # fmt: skip
    [t] = forced(ev, 1000.0)
    assert (t.rule, t.subject, t.action) == ("run_resending", "shop_chain/looping", "fire")
    assert (
        "tasks of run shop_chain/looping re-sent since it last finished one is 6"
        in (receiver.bodies[0]["summary"])
    )
    rds.hset(state.run_key("looping"), "last", "70")  # it made progress
    [t] = forced(ev, 1010.0)
    assert (t.subject, t.action) == ("shop_chain/looping", "resolve")


def test_a_removed_rule_closes_its_incident(rds, mon, receiver) -> None:
    rule = {"name": "p", "kind": "pool_size", "below": 1}
    health.report(rds, health.PoolHealth("cookie:shop", size=0), mon)
    evaluator(rds, mon, receiver, rule).tick(now=1000.0, force=True)
    evaluator(rds, mon, receiver).tick(now=1010.0, force=True)  # config without the rule
    assert [b["status"] for b in receiver.bodies] == ["firing", "resolved"]
    assert "no longer configured" in receiver.bodies[1]["summary"]


# --- configuration --------------------------------------------------------------------------------


def test_durations() -> None:
    assert duration(90) == 90 and duration("90") == 90 and duration("5m") == 300
    assert duration("1h30m") == 5400 and duration("250ms") == 0.25
    with pytest.raises(ValueError):
        duration("5 minutes")


def test_the_sample_rules_file_is_valid() -> None:
    cfg = load_config(
        ROOT / "alerts.yaml", AlertSettings(webhook="", rules="", file="", interval="")
    )
    names = {r.name for r in cfg.rules}
    assert {"endpoint_failing", "pool_empty", "queue_growing", "no_workers",
            "run_resending"} <= names  # fmt: skip
    failing = next(r for r in cfg.rules if r.name == "endpoint_failing")
    assert (failing.kind, failing.above) == ("failure_rate", 0.2)
    assert (failing.window, failing.hold) == (300, 300)


def test_env_overrides_file(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_text("webhook: {url: 'http://127.0.0.1:1/x', headers: {X-Token: abc}}\n"
                 "interval: 1m\nrules:\n  - {name: a, kind: workers, below: 1}\n")  # fmt: skip
    cfg = load_config(f, AlertSettings(webhook="", rules="", file="", interval=""))
    assert cfg.webhook == "http://127.0.0.1:1/x" and cfg.headers == {"X-Token": "abc"}
    assert cfg.interval == 60 and [r.name for r in cfg.rules] == ["a"]
    env = AlertSettings(webhook="http://127.0.0.1:2/y", interval="5",
                        rules="[{name: b, kind: queue_depth, above: 10, match: 'shop*'}]", file="")  # fmt: skip
    cfg = load_config(f, env)
    assert cfg.webhook == "http://127.0.0.1:2/y" and cfg.interval == 5
    assert [(r.name, r.match) for r in cfg.rules] == [("b", "shop*")]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"name": "x", "kind": "nope", "above": 1}, "kind must be one of"),
        ({"name": "x", "kind": "workers"}, "exactly one of"),
        ({"name": "x", "kind": "workers", "above": 1, "below": 2}, "exactly one of"),
        ({"name": "x", "kind": "workers", "below": 1, "windw": 3}, "unknown keys"),
        ({"kind": "workers", "below": 1}, "without a name"),
        ({"name": "x", "kind": "failure_rate", "above": 0.1, "window": "soon"}, "not a duration"),
    ],
)
def test_bad_rules_are_explained(rule: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_config({"rules": [rule]})


def test_duplicate_rule_names_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        parse_config({"rules": [{"name": "a", "kind": "workers", "below": 1}] * 2})


def test_rule_threshold_semantics() -> None:
    r = Rule("r", "queue_depth", above=5)
    assert r.breached(6) and not r.breached(5) and not r.breached(None)
    assert Rule("r", "pool_size", below=1).breached(0)
    assert AlertConfig().max_window == 0
