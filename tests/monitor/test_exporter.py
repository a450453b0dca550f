"""The exporter serves what Redis holds, in the text format the official parser reads."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.crc import key_slot

import monitor.exporter
import monitor.status
from ledger.state import RunState
from monitor import health
from monitor.deadletter import DeadLetter, DeadLetterStore
from monitor.exporter import is_loopback, serve
from settings.monitor import MonitorSettings
from tests.monitor.conftest import record
from utils.keyspace import Keyspace
from utils.slots import LostRange


def scrape(url: str, auth: str | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def families(text: str) -> dict[str, dict[Any, Any]]:
    """{family: {(sample name, sorted labels): value, "_type": type}} via the official parser."""
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(text):
        d = out.setdefault(fam.name, {"_type": fam.type})
        for smp in fam.samples:
            d[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def value(fams: dict, family: str, sample: str | None = None, **labels: str) -> float:
    """A sample's value; the sample name defaults to the family's (+ _total for counters)."""
    if sample is None:
        sample = family + ("_total" if fams[family]["_type"] == "counter" else "")
    return fams[family][(sample, tuple(sorted(labels.items())))]


@pytest.fixture
def populated(rds, mon):
    record(rds, mon, "shop.web.listing", ok=8, failed=2, retried=3, error="Throttled",
           latency=0.03, nbytes=1000, items=24)  # fmt: skip
    record(rds, mon, "shop.web.detail", ok=5, latency=2.0, status=200, nbytes=50, items=5)
    rds.hset(mon.key("metrics", "task", "shop.web.detail"), "stored", 5)
    listing = {"paused": 2, "duplicate": 1, "unreplicated": 4}
    rds.hset(mon.key("metrics", "task", "shop.web.listing"), mapping=listing)
    state = RunState(rds, mon)
    state.create_run("r1", "shop_chain", b"{}", 5)
    state.add_dispatched("r1", "web.listing", 10)
    rds.hset(state.counters_key("r1"), mapping={"web.listing:succeeded": 4, "succeeded": 4})
    health.report(rds, health.PoolHealth("cookie:shop", size=0, bans=3, produced=7), mon)
    DeadLetterStore(rds, mon).add(
        DeadLetter("t1", "shop.web.listing", {}, {}, "ServerError", "500", "tb", 3)
    )
    rds.xadd(mon.key("outbox"), {"run": "r1", "type": "x", "items": "[]"})
    for _ in range(4):
        rds.lpush(f"{mon.key_prefix}:q:shop", b"msg")
    rds.lpush(f"{mon.key_prefix}:q:shop:3", b"msg")
    rds.hset(mon.key("metrics", "broker"),
             mapping={"malformed": 2, "malformed:shop": 2, "dead_worker_restored": 4})  # fmt: skip
    return mon


def test_metrics_are_served_in_the_text_format(rds, populated) -> None:
    server, note = serve(populated, MonitorSettings(), address="127.0.0.1", port=0, client=rds)
    try:
        code, ctype, text = scrape(server.url)
    finally:
        server.close()
    assert code == 200 and ctype.startswith("text/plain") and "no auth" in note
    for name in (
        "chaincrawl_tasks_total{",
        "chaincrawl_retries_total{",
        "chaincrawl_http_responses_total{",
        "chaincrawl_task_latency_seconds_bucket{",
    ):
        assert name in text, name  # the exact series names dashboards use
    f = families(text)
    lst = {"site": "shop", "task": "shop.web.listing"}
    assert f["chaincrawl_tasks"]["_type"] == "counter"
    assert value(f, "chaincrawl_tasks", **lst, outcome="succeeded") == 8
    assert value(f, "chaincrawl_tasks", **lst, outcome="failed") == 2
    assert value(f, "chaincrawl_tasks", **lst, outcome="started") == 13
    assert value(f, "chaincrawl_tasks", **lst, outcome="paused") == 2  # parked: run paused
    assert value(f, "chaincrawl_tasks", **lst, outcome="duplicate") == 1
    assert value(f, "chaincrawl_tasks", **lst, outcome="cancelled") == 0
    assert value(f, "chaincrawl_task_unreplicated", **lst) == 4  # requeued: no replica
    assert value(f, "chaincrawl_retries", **lst, reason="Throttled") == 3
    assert value(f, "chaincrawl_failures", **lst, reason="Throttled") == 2
    assert value(f, "chaincrawl_http_responses", **lst, status="200") == 8
    assert value(f, "chaincrawl_http_responses", **lst, status="503") == 3
    assert value(f, "chaincrawl_http_requests", **lst) == 13
    assert value(f, "chaincrawl_response_bytes", **lst) == 8000 + 50
    assert value(f, "chaincrawl_items", **lst) == 24
    det = {"site": "shop", "task": "shop.web.detail"}
    assert value(f, "chaincrawl_items_stored", **det) == 5

    # the histogram: cumulative buckets in seconds, +Inf = count, sum in seconds
    h = "chaincrawl_task_latency_seconds"
    assert f[h]["_type"] == "histogram"
    assert value(f, h, h + "_bucket", **lst, le="0.025") == 0
    assert value(f, h, h + "_bucket", **lst, le="0.05") == 13
    assert value(f, h, h + "_bucket", **lst, le="+Inf") == 13
    assert value(f, h, h + "_count", **lst) == 13
    assert value(f, h, h + "_sum", **lst) == pytest.approx(13 * 0.03)
    assert value(f, h, h + "_bucket", **det, le="1.0") == 0
    assert value(f, h, h + "_bucket", **det, le="2.5") == 5

    assert value(f, "chaincrawl_queue_depth", queue="shop") == 5
    assert value(f, "chaincrawl_dead_letters") == 1
    assert value(f, "chaincrawl_broker_malformed") == 2
    assert value(f, "chaincrawl_broker_dead_worker_restored") == 4
    assert value(f, "chaincrawl_outbox_backlog") == 1
    pool = {"pool": "cookie:shop", "kind": "cookie", "site": "shop"}
    assert value(f, "chaincrawl_pool_size", **pool) == 0
    assert value(f, "chaincrawl_pool_banned", **pool) == 3
    assert value(f, "chaincrawl_pool_produced", **pool) == 7
    assert value(f, "chaincrawl_active_runs") == 1
    run = {"run": "r1", "chain": "shop_chain"}
    assert value(f, "chaincrawl_run_outstanding", **run) == 10
    assert value(f, "chaincrawl_run_paused", **run) == 0
    step = {**run, "step": "web.listing"}
    assert value(f, "chaincrawl_run_tasks", **step, counter="dispatched") == 10
    assert value(f, "chaincrawl_run_tasks", **step, counter="succeeded") == 4
    assert value(f, "chaincrawl_up") == 1


def test_a_paused_run_shows_as_paused(rds, populated) -> None:
    from ledger.state import RunState

    RunState(rds, populated).pause("r1")
    server, _ = serve(populated, MonitorSettings(), address="127.0.0.1", port=0, client=rds)
    try:
        _, _, text = scrape(server.url)
    finally:
        server.close()
    assert value(families(text), "chaincrawl_run_paused", run="r1", chain="shop_chain") == 1


def test_openmetrics_is_negotiated(rds, populated) -> None:
    server, _ = serve(populated, MonitorSettings(), address="127.0.0.1", port=0, client=rds)
    try:
        req = urllib.request.Request(server.url, headers={"Accept": "application/openmetrics-text"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
            assert resp.read().decode().rstrip().endswith("# EOF")
    finally:
        server.close()


def test_a_configured_password_is_required_even_on_loopback(rds, populated) -> None:
    ms = MonitorSettings(user="prom", password="s3cret-pw")
    server, note = serve(populated, ms, address="127.0.0.1", port=0, client=rds)
    try:
        code, _, body = scrape(server.url)
        assert code == 401 and "chaincrawl_tasks" not in body
        assert scrape(server.url, "Basic " + "cHJvbTp3cm9uZw==")[0] == 401  # prom:wrong
        import base64

        good = "Basic " + base64.b64encode(b"prom:s3cret-pw").decode()
        code, _, body = scrape(server.url, good)
        assert code == 200 and "chaincrawl_tasks_total" in body
        assert scrape(server.url.replace("/metrics", "/healthz"))[0] == 200
    finally:
        server.close()
    assert "basic auth" in note and "s3cret" not in note


def test_non_loopback_address_gets_a_generated_password(populated) -> None:
    """Binding beyond loopback always means auth; the password is made once, kept 0600."""
    from monitor.exporter import monitor_password

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("")
    pw, where = monitor_password(populated, MonitorSettings())
    again, _ = monitor_password(populated, MonitorSettings())
    secret = populated.var_dir / "monitor.secret"
    assert pw == again and where == str(secret) and len(pw) >= 12
    assert secret.stat().st_mode & 0o077 == 0


def test_redis_down_is_reported_not_raised(mon) -> None:
    import redis as redis_lib
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    dead = redis_lib.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    server, _ = serve(mon, MonitorSettings(), address="127.0.0.1", port=0, client=dead)
    try:
        code, _, text = scrape(server.url)
    finally:
        server.close()
    assert code == 200
    assert value(families(text), "chaincrawl_up", "chaincrawl_up") == 0


def test_lifecycle_hooks_are_exported_with_calls_time_and_signals(rds, populated) -> None:
    key = populated.key("metrics", "task", "shop.web.listing")
    base = "hook:before_store:shop.hooks.no_free"
    rds.hset(key, mapping={f"{base}:calls": 7, f"{base}:us": 3500, f"{base}:continue": 5,
                           f"{base}:skip": 2})  # fmt: skip
    server, _ = serve(populated, MonitorSettings(), address="127.0.0.1", port=0, client=rds)
    try:
        _, _, text = scrape(server.url)
    finally:
        server.close()
    fams = families(text)
    labels = {"site": "shop", "task": "shop.web.listing", "point": "before_store",
              "hook": "shop.hooks.no_free"}  # fmt: skip
    assert value(fams, "chaincrawl_hook_calls", **labels) == 7
    assert value(fams, "chaincrawl_hook_seconds", **labels) == pytest.approx(0.0035)
    assert value(fams, "chaincrawl_hook_signals", signal="skip", **labels) == 2
    assert value(fams, "chaincrawl_hook_signals", signal="continue", **labels) == 5


def test_a_lost_slot_range_is_exported_with_the_runs_paused_on_it(
    rds, populated, monkeypatch
) -> None:
    """A lost range (docs/cluster.md) as series: its slots, the runs paused on it, and the
    workers' counts of outages and parked messages; nothing lost: 0 and no range."""
    server, _ = serve(populated, MonitorSettings(), address="127.0.0.1", port=0, client=rds)

    def scrape_once() -> dict[str, dict[Any, Any]]:
        return families(scrape(server.url)[2])

    try:
        fams = scrape_once()
        assert value(fams, "chaincrawl_slots_lost") == 0
        assert len(fams["chaincrawl_slot_range_lost"]) == 1  # its type only: no range
        assert value(fams, "chaincrawl_messages_parked_lost") == 0
        slot = key_slot(Keyspace(populated.key_prefix).run("r1").encode())
        lost = [LostRange(slot, slot + 9, "127.0.0.1:17102", ("127.0.0.1:17105",)),
                LostRange(slot + 20, slot + 20, "127.0.0.1:17103", ())]  # fmt: skip
        monkeypatch.setattr(monitor.exporter, "lost_ranges", lambda r: lost)
        monkeypatch.setattr(monitor.status, "lost_ranges", lambda r: lost)
        rds.hset(populated.key("metrics", "cluster"), mapping={"lost_slots": 2, "parked_lost": 57})
        fams = scrape_once()
    finally:
        server.close()
    assert value(fams, "chaincrawl_slots_lost") == 11
    rng = "chaincrawl_slot_range_lost"
    assert value(fams, rng, slots=f"{slot}-{slot + 9}", master="127.0.0.1:17102") == 1
    assert value(fams, rng, slots=f"{slot + 20}", master="127.0.0.1:17103") == 0
    assert value(fams, "chaincrawl_lost_slot_outages") == 2
    assert value(fams, "chaincrawl_messages_parked_lost") == 57
    assert value(fams, "chaincrawl_run_paused", run="r1", chain="?") == 1
    assert value(fams, "chaincrawl_up") == 1
