"""Periodic chains: the schedule file, the trigger's "not twice" rule, and beat end to end."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import cast

import pytest
from celery.schedules import crontab

from cli import beat
from config import ROOT, get_settings
from exceptions import ConfigError
from ledger.state import RunState
from scheduling.periodic import TRIGGER_TASK, ScheduleEntry, beat_schedule, load_schedule
from scheduling.tasks import entry_key, trigger
from tests.scheduling.server import SchedSite
from utils.redis import get_redis


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "schedules.yaml"
    p.write_text(text)
    return p


# --- the schedule file -------------------------------------------------------------------


def test_the_shipped_sample_is_valid() -> None:
    s = load_schedule(ROOT / "schedules.yaml")
    [e] = [e for e in s.entries if e.name == "demo-hourly"]
    assert e.cron == "0 * * * *" and e.only_if_reachable
    bs = beat_schedule(s)["chain:demo-hourly"]
    assert bs["task"] == TRIGGER_TASK and bs["options"]["queue"] == "resources"
    assert isinstance(bs["schedule"], crontab)


def test_entries_cron_every_and_defaults(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SITE_URL", "http://127.0.0.1:9999")
    p = write(
        tmp_path,
        """
timezone: Asia/Shanghai
schedules:
  nightly:
    chain: c1
    cron: "@daily"
    priority: 2
    seeds: [{page: 1}, {page: 2}]
  often:
    chain: c2
    every: 15m
    only_if_reachable: ${SITE_URL}/health
    stale_after: 2h
  later:
    chain: c3
    every: 90
    enabled: false
    only_if_reachable: ${NOT_SET:-http://127.0.0.1:1}/
""",
    )
    s = load_schedule(p)
    assert s.timezone == "Asia/Shanghai"
    nightly, often, later = s.entries
    assert nightly.seeds == [{"page": 1}, {"page": 2}] and nightly.priority == 2
    assert often.seeds == [{}] and often.priority is None
    assert often.only_if_reachable == "http://127.0.0.1:9999/health"
    assert often.stale_seconds == 7200 and often.expires_seconds() == 900
    assert later.only_if_reachable == "http://127.0.0.1:1/"
    bs = beat_schedule(s)
    assert set(bs) == {"chain:nightly", "chain:often"}  # disabled entries are not scheduled
    assert bs["chain:often"]["schedule"] == timedelta(minutes=15)
    assert bs["chain:nightly"]["args"][0] == "nightly"
    assert ScheduleEntry.model_validate({**bs["chain:often"]["args"][1], "name": "often"}) == often


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("chain: c\n    cron: '61 * * * *'", "cron '61 * * * *'"),
        ("chain: c\n    cron: '0 * * *'", "needs 5 fields"),
        ("chain: c\n    cron: '@hourly'\n    every: 1h", "exactly one of `cron` or `every`"),
        ("chain: c", "exactly one of `cron` or `every`"),
        ("chain: c\n    every: soon", "'soon' is not an interval"),
        (
            "chain: c\n    every: 1h\n    priority: 12",
            "priority: Input should be less than or equal to 9",
        ),
        ("chain: c\n    every: 1h\n    seeds: []", "seeds"),
        ("chain: c\n    every: 1h\n    colour: red", "colour: Extra inputs are not permitted"),
        ("chain: c\n    every: 1h\n    only_if_reachable: localhost:80", "not an http(s) URL"),
        ("every: 1h", "exactly one of `chain` or `step`"),
        ("chain: c\n    step: a.b.c\n    every: 1h", "exactly one of `chain` or `step`"),
        (
            "step: a.b.c\n    cron: '@hourly'\n    by_change: {item: t, key: k, budget: 10}",
            "looks for due keys `every` so often, not by cron",
        ),
        ("step: a.b.c\n    by_change: {item: t, key: k, budget: lots}", "not a budget"),
        ("step: a.b.c\n    by_change: {item: t, key: k}", "by_change.budget: Field required"),
        (
            "step: a.b.c\n    by_change: {item: t, key: k, budget: 9, min_interval: 8d}",
            "min_interval is longer than max_interval",
        ),
        ("step: a.b.c\n    by_change: {item: t, key: k, budget: 9, alpha: 2}", "alpha"),
    ],
)
def test_errors_name_file_entry_and_field(tmp_path, body: str, needle: str) -> None:
    p = write(tmp_path, f"schedules:\n  broken:\n    {body}\n")
    with pytest.raises(ConfigError) as err:
        load_schedule(p)
    assert f"{p}: entry 'broken'" in str(err.value)
    assert needle in str(err.value)


def test_by_change_entries(tmp_path) -> None:
    p = write(
        tmp_path,
        """
schedules:
  posts:
    step: demo.h5.detail
    by_change: {item: demo.post, key: post_id, fields: [likes], budget: 100/h, max_interval: 3d}
  users:
    chain: demo_users
    every: 5m
    by_change: {item: demo.user, key: user_id, param: uid, budget: 500}
""",
    )
    posts, users = load_schedule(p).entries
    assert posts.target == "demo.h5.detail" and posts.interval == 60  # looks every minute
    knobs = posts.by_change.knobs()  # type: ignore[union-attr]
    assert (knobs.budget, knobs.min_interval, knobs.max_interval, knobs.alpha) == (
        2400,
        600,
        3 * 86400,
        0.9,
    )
    assert users.by_change.param == "uid" and users.interval == 300  # type: ignore[union-attr]
    assert "by change of demo.post.post_id within 2400 pages/day" in posts.when()
    bs = beat_schedule(load_schedule(p))["chain:posts"]
    assert ScheduleEntry.model_validate({**bs["args"][1], "name": "posts"}) == posts


def test_file_level_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_schedule(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="top-level keys"):
        load_schedule(write(tmp_path, "demo:\n  chain: x\n"))
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_schedule(write(tmp_path, "schedules: [\n"))


# --- the trigger, in this process (no worker: a started run stays "running") ---------------


def slow_entry(name: str, **kw) -> ScheduleEntry:
    return ScheduleEntry(name=name, chain="sched_slow", every="1h",
                         seeds=[{"tag": name, "s": 0.1}], **kw)  # fmt: skip


def test_a_running_run_is_not_started_twice(sched_env) -> None:
    e = slow_entry(f"e{uuid.uuid4().hex[:6]}")
    first = trigger(e)
    assert first.status == "started" and first.run_id
    again = trigger(e)
    assert again.status == "running" and again.run_id == first.run_id
    r = get_redis()
    assert cast(bytes, r.hget(entry_key(e.name), "run")).decode() == first.run_id
    assert b"running" in cast(bytes, r.hget(entry_key(e.name), "last_outcome"))
    # once the run is done, the next tick starts a new one
    state = RunState(r)
    r.hset(state.run_key(first.run_id), "status", "done")
    r.srem(state.active_key, first.run_id)
    third = trigger(e)
    assert third.status == "started" and third.run_id != first.run_id


def test_concurrent_triggers_start_one_run(sched_env) -> None:
    e = slow_entry(f"e{uuid.uuid4().hex[:6]}")
    r = get_redis()
    r.set(f"{entry_key(e.name)}:lock", "someone-else", px=5000)
    assert trigger(e).status == "running"  # another trigger holds the decision
    assert r.hget(entry_key(e.name), "run") is None


def test_stale_run_no_longer_blocks(sched_env) -> None:
    e = slow_entry(f"e{uuid.uuid4().hex[:6]}", stale_after="1s")
    first = trigger(e)
    RunState(get_redis()).r.hset(
        RunState(get_redis()).run_key(first.run_id), "created", time.time() - 5
    )
    second = trigger(e)
    assert second.status == "started" and second.run_id != first.run_id


def test_harmless_skips(sched_env) -> None:
    down = ScheduleEntry(
        name="down", chain="sched_slow", every="1h", only_if_reachable="http://127.0.0.1:1/"
    )
    out = trigger(down)
    assert out.status == "skipped" and "not reachable" in out.reason
    missing = ScheduleEntry(name="missing", chain="no_such_chain", every="1h")
    out = trigger(missing)
    assert out.status == "skipped" and "UnknownChainError" in out.reason
    assert RunState(get_redis()).active_runs() == []


# --- with real workers and beat ------------------------------------------------------------


@pytest.mark.integration
def test_trigger_task_on_a_worker_never_doubles_a_run(start_workers, sched_site: SchedSite) -> None:
    from worker import app

    start_workers(1, concurrency=4)
    name = f"e{uuid.uuid4().hex[:6]}"
    e = ScheduleEntry(name=name, chain="sched_slow", every="1h", seeds=[{"tag": name, "s": 1.5}])
    spec = e.model_dump(mode="json", exclude={"name"})
    r = get_redis()
    for _ in range(4):  # four ticks while the first run is going
        app.send_task(TRIGGER_TASK, args=(name, spec), queue="resources")
        time.sleep(0.1)
    deadline = time.monotonic() + 10
    while not sched_site.tagged(name) or len(r.hkeys(entry_key(name))) < 5:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)
    first_run = cast(bytes, r.hget(entry_key(name), "run")).decode()
    assert len(sched_site.tagged(name)) == 1
    while RunState(r).info(first_run).get("status") != "done":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    app.send_task(TRIGGER_TASK, args=(name, spec), queue="resources")
    while len(sched_site.tagged(name)) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert cast(bytes, r.hget(entry_key(name), "run")).decode() != first_run
    assert sched_site.max_in_flight[name] == 1


@pytest.mark.integration
def test_beat_ticks_every_second_but_runs_never_overlap(
    start_workers, start_beat, sched_site: SchedSite, tmp_path: Path
) -> None:
    """Beat fires every second; each run takes 2 s: runs follow one another, never overlap."""
    name = f"e{uuid.uuid4().hex[:6]}"
    schedule = write(
        tmp_path,
        f"""
schedules:
  {name}:
    chain: sched_slow
    every: 1s
    priority: 7
    seeds: [{{tag: {name}, s: 2}}]
""",
    )
    start_workers(1, concurrency=4)
    beat = start_beat(schedule)
    deadline = time.monotonic() + 20
    while len(sched_site.tagged(name)) < 2:
        assert time.monotonic() < deadline, beat.text()[-2000:]
        time.sleep(0.1)
    beat.stop()
    hits = sched_site.tagged(name)
    sent = beat.text().count(f"Scheduler: Sending due task chain:{name}")
    print(
        f"\nbeat sent {sent} triggers; {len(hits)} runs started, {hits[1].t - hits[0].t:.2f}s apart"
    )
    assert sent >= 3  # beat kept ticking while the first run was going
    assert sched_site.max_in_flight[name] == 1
    assert hits[1].t - hits[0].t >= 2.0  # the second run began after the first one ended


def test_cli_beat_check(tmp_path, capsys) -> None:
    from cli.__main__ import main

    assert main(["beat", "--check", "--schedule", str(ROOT / "schedules.yaml")]) == 0
    assert "demo-hourly: chain demo_social" in capsys.readouterr().out
    bad = write(tmp_path, "schedules:\n  x:\n    chain: c\n")
    assert main(["beat", "--check", "--schedule", str(bad)]) == 2
    assert "entry 'x'" in capsys.readouterr().err


def test_module_entry_point_reports_config_errors(tmp_path, capsys) -> None:
    assert beat.main(["--schedule", str(tmp_path / "missing.yaml")]) == 2
    assert "schedule file not found" in capsys.readouterr().err
    assert get_settings()  # nothing else was touched
