"""Monitoring against real workers: status during a run, metrics after it, the monitor process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import chains
from config import ROOT, Settings, get_settings
from monitor import snapshot as msnap
from monitor.exporter import serve
from settings.monitor import MonitorSettings
from tests.testsite import chains as tchains
from tests.testsite.server import PAGES, PER_PAGE, REVIEW_PAGES
from utils.redis import get_redis
from utils.servers import free_port

pytestmark = pytest.mark.integration

ENTRIES = PAGES * PER_PAGE


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=15) as resp:
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def get(m: dict, name: str, **labels: str) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before: dict, after: dict, task: str) -> dict[str, float]:
    """The samples of `task` that changed between two scrapes, by name and other labels."""
    out = {}
    for (name, labels), v in after.items():
        if ("task", task) in labels and not name.endswith("_bucket"):
            d = v - before.get((name, labels), 0.0)
            if d:
                rest = ",".join(f"{k}={x}" for k, x in labels if k not in ("site", "task"))
                out[f"{name}{{{rest}}}"] = d
    return out


def clear_other_runs_messages(s: Settings) -> int:
    """The site's metrics count every run's pages: messages an earlier test of this shared
    environment left in the broker (a run it stopped early) would be crawled by this test's
    worker and counted. They are dropped before it starts -> how many there were."""
    r = get_redis(s.broker_url)
    p = s.broker_key_prefix
    queues = [k for k in r.scan_iter(match=f"{p}testsite*", _type="list")]
    n = sum(int(r.llen(k)) for k in queues) + int(r.hlen(f"{p}unacked"))
    r.delete(*queues, f"{p}unacked", f"{p}unacked_index")
    return n


def test_status_during_a_run_and_metrics_after_it(start_worker, cc_env) -> None:
    s = get_settings()
    left = clear_other_runs_messages(s)
    if left:
        print(f"dropped {left} messages earlier tests left in the broker", file=sys.stderr)
    # no sweeper in this worker: it would re-send the ledger tasks of runs earlier tests left
    # unfinished, whose pages the site's metrics would count as this run's
    start_worker(
        concurrency=4, name="mon", CHAINCRAWL_SWEEP_STALL="0", CHAINCRAWL_DEAD_WORKER_AFTER="0"
    )
    server, _ = serve(s, MonitorSettings(), address="127.0.0.1", port=0)
    try:
        before = scrape(server.url)
        run = chains.run(tchains.three_step(delay=0.3), seeds=[{"page": 1}])
        seen_worker = seen_run = False
        while not run.progress().complete:
            snap = msnap.snapshot(s, workers_timeout=1.0)
            seen_worker |= any(name.startswith("mon") for name in snap["workers"] or {})
            mine = [r for r in snap["active_runs"] if r["run_id"] == run.run_id]
            if mine:
                seen_run = True
                assert set(mine[0]["steps"]) == {"local.listing", "local.detail", "local.reviews"}
            time.sleep(0.1)
        p = run.wait(timeout=90)
        after = scrape(server.url)
    finally:
        server.close()
    assert seen_worker and seen_run
    expected = {
        "testsite.local.listing": PAGES,
        "testsite.local.detail": ENTRIES,
        "testsite.local.reviews": ENTRIES * REVIEW_PAGES,
    }
    for task, n in expected.items():
        lab = {"site": "testsite", "task": task}

        def delta(name: str, m: dict = lab, **more: str) -> float:
            return get(after, name, **m, **more) - get(before, name, **m, **more)

        # on a failure, what else moved for the task (a duplicate, a retry, a redelivery...)
        # and the run's counters (resent by the sweeper): which path ran a page twice
        why = (task, moved(before, after, task), p.totals)
        assert delta("chaincrawl_tasks_total", outcome="succeeded") == n, why
        assert delta("chaincrawl_http_responses_total", status="200") == n, why
        assert delta("chaincrawl_task_latency_seconds_count") == n, why
        assert delta("chaincrawl_task_latency_seconds_bucket", le="+Inf") == n, why
        assert delta("chaincrawl_response_bytes_total") > 0, why
    items = sum(
        get(after, "chaincrawl_items_total", site="testsite", task=t)
        - get(before, "chaincrawl_items_total", site="testsite", task=t)
        for t in expected
    )
    assert items == p.totals["items"]
    reviews = {"site": "testsite", "task": "testsite.local.reviews"}
    # every review page waited 0.3 s at the site: nothing under 250 ms, all under 2.5 s
    assert get(after, "chaincrawl_task_latency_seconds_bucket", **reviews, le="0.25") == get(
        before, "chaincrawl_task_latency_seconds_bucket", **reviews, le="0.25"
    )
    assert get(after, "chaincrawl_queue_depth", queue="testsite") == 0
    assert get(after, "chaincrawl_up") == 1


def test_the_monitor_process_serves_and_alerts_with_real_workers(
    start_worker, cc_env, receiver
) -> None:
    """`control.sh monitor` in the background: /metrics, a no-workers incident, its recovery."""
    port = free_port()
    env = {
        **os.environ,
        "CHAINCRAWL_MONITOR_PORT": str(port),
        "CHAINCRAWL_ALERTS_RULES": "[{name: no_workers, kind: workers, below: 1}]",
        "CHAINCRAWL_ALERTS_INTERVAL": "1",
        "CHAINCRAWL_ALERTS_WEBHOOK": receiver.url,
    }
    cli = [sys.executable, "-m", "cli.monitoring"]
    out = subprocess.run(
        [*cli, "start"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"http://127.0.0.1:{port}/metrics" in out.stdout and "1 rule(s)" in out.stdout
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not receiver.bodies:
            time.sleep(0.2)
        assert [b["status"] for b in receiver.bodies] == ["firing"]
        m = scrape(f"http://127.0.0.1:{port}/metrics")
        assert get(m, "chaincrawl_up") == 1
        assert get(m, "chaincrawl_alerts_firing", rule="no_workers", subject="workers") == 1
        start_worker(name="alive")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(receiver.bodies) < 2:
            time.sleep(0.2)
        assert [b["status"] for b in receiver.bodies] == ["firing", "resolved"]
        assert receiver.bodies[0]["incident"] == receiver.bodies[1]["incident"]
        m = scrape(f"http://127.0.0.1:{port}/metrics")
        assert get(m, "chaincrawl_workers") >= 1
    finally:
        stop = subprocess.run(
            [*cli, "stop"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
    assert "monitor" in stop.stdout
    log = (get_settings().var_dir / "log" / "monitor.log").read_text()
    assert "ALERT FIRING [no_workers]" in log and "ALERT RESOLVED [no_workers]" in log


def test_the_monitor_start_is_not_fooled_by_another_listener_on_its_port(cc_env) -> None:
    """A port another process holds: the monitor's exporter cannot bind it and exits, and the
    start says so instead of reporting the other listener as the monitor."""
    port = free_port()
    env = {**os.environ, "CHAINCRAWL_MONITOR_PORT": str(port), "CHAINCRAWL_ALERTS_RULES": "[]"}
    cli = [sys.executable, "-m", "cli.monitoring"]
    with socket.create_server(("127.0.0.1", port)):
        out = subprocess.run(
            [*cli, "start"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
    subprocess.run([*cli, "stop"], cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert out.returncode != 0, out.stdout + out.stderr
    assert "another process listens on 127.0.0.1" in out.stdout + out.stderr
    assert f"http://127.0.0.1:{port}/metrics" not in out.stdout
