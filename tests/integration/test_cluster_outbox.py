"""The outbox's operator side on a real Redis Cluster: `--status` and `--requeue-dead` over
every run's own stream and dead letters, the alert rules and the exporter reading the same,
a cancelled run's items drained, and the drainer's idle polling backing off."""

from __future__ import annotations

import time
import uuid
from typing import Any, cast

import orjson
import pytest
import redis
from rich.console import Console

from cli import status as cli_status
from config import Settings, reset_settings
from external_interface.storage.outbox import (
    ClusterDrainer,
    backlog,
    cluster_backlog,
    outbox_streams,
    requeue_dead,
)
from external_interface.storage.outbox.__main__ import main as outbox_main
from external_interface.storage.outbox.cluster import POLL_MAX, POLL_MIN
from external_interface.storage.sinks.base import PermanentSinkError
from external_interface.storage.sinks.jsonl import JsonlSink, iter_records
from ledger.state import RunState
from monitor import health
from monitor import snapshot as msnap
from monitor import status as ms
from monitor.alerts import Evaluator, parse_config
from monitor.exporter import ChaincrawlCollector
from tests.monitor.conftest import record
from utils.keyspace import Keyspace
from utils.redis import cluster_client, reset_clients

pytestmark = pytest.mark.integration


def _settings(url: str, prefix: str, broker: str = "redis://127.0.0.1:1/0") -> Settings:
    return Settings(redis_url=url, broker_url=broker, key_prefix=prefix)


def _entry(rid: str, n: int, step: str = "s") -> dict[str, Any]:
    return {"run": rid, "step": step, "task": "demo.t", "type": "thing", "key": '["k"]',
            "items": orjson.dumps([{"k": f"{rid}-{n}"}])}  # fmt: skip


def _rid() -> str:
    return uuid.uuid4().hex[:12]


class Refusing:
    """A sink that refuses every item for good (its entries are dead-lettered)."""

    name = "refusing"

    def write(self, item_type: str, key_fields: Any, items: Any, *, origins: Any = None) -> None:
        raise PermanentSinkError("refused", self.name)

    def close(self) -> None:
        pass


def test_status_sums_every_runs_stream_and_dead_letters(redis_cluster, key_prefix) -> None:
    """Entries wait in two active runs' streams (some read by a drainer that died: pending,
    claimable), tasks without a run have one, and a run in neither set has only dead
    letters: the backlog sums them all and shows a row per run."""
    client = cast(redis.Redis, cluster_client(redis_cluster.url))
    ks = Keyspace(key_prefix)
    a, b, gone = _rid(), _rid(), _rid()
    for rid, n in ((a, 3), (b, 2)):
        client.sadd(ks.active_runs, rid)
        for i in range(n):
            client.xadd(ks.run_outbox(rid), _entry(rid, i))  # type: ignore[arg-type]
    client.xadd(ks.run_outbox(""), _entry("", 0))  # type: ignore[arg-type]
    client.xadd(ks.run_outbox_dead(gone), {**_entry(gone, 0), "error": "x"})  # type: ignore[dict-item]
    client.xadd(ks.run_outbox_dead(gone), {**_entry(gone, 1), "error": "x"})  # type: ignore[dict-item]
    found = {s.rid: s for s in outbox_streams(client, key_prefix)}
    assert {None, "", a, b} <= set(found) and gone not in found  # the sets alone: no SCAN
    found = {s.rid: s for s in outbox_streams(client, key_prefix, scan=True)}
    assert {None, "", a, b, gone} <= set(found)  # `gone` only by the scan of the masters
    assert found[gone].dead == ks.run_outbox_dead(gone)
    dying = ClusterDrainer(client, key_prefix, [], hooks=[], runs_hooks=[], consumer="dying")
    dying.ensure_group()
    assert len(dying.read(2, None)) >= 2  # read, never acknowledged
    assert backlog(client, key_prefix)["dead"] == 0  # what no drainer noted needs the scan
    got = backlog(client, key_prefix, scan=True)
    assert (got["length"], got["dead"]) == (6, 2)
    assert got["pending"] == sum(got["consumers"].values()) == got["consumers"]["dying"] >= 2
    assert got["undelivered"] == 6 - got["pending"]
    assert got["claimable"] == 0  # idle for less than the claim time
    assert got["oldest_entry_age"] is not None and got["oldest_pending_age"] is not None
    assert {r: row["length"] for r, row in got["runs"].items()} == {a: 3, b: 2, "": 1, gone: 0}
    assert got["runs"][gone]["dead"] == 2
    assert (
        cluster_backlog(client, key_prefix, claim_idle=0, scan=True)["claimable"] == got["pending"]
    )


def test_the_status_command_prints_the_cluster_backlog(
    redis_cluster, redis_url, key_prefix, monkeypatch, capsys
) -> None:
    client = cast(redis.Redis, cluster_client(redis_cluster.url))
    ks = Keyspace(key_prefix)
    rid = _rid()
    client.sadd(ks.storing_runs, rid)
    client.xadd(ks.run_outbox(rid), _entry(rid, 0))  # type: ignore[arg-type]
    monkeypatch.setenv("CHAINCRAWL_REDIS_URL", redis_cluster.url)
    monkeypatch.setenv("CHAINCRAWL_BROKER_URL", redis_url)
    monkeypatch.setenv("CHAINCRAWL_KEY_PREFIX", key_prefix)
    with _fresh_settings():
        assert outbox_main(["--status"]) == 0
    got = orjson.loads(capsys.readouterr().out)
    assert got["length"] == 1 and got["runs"][rid]["length"] == 1


def test_requeue_dead_puts_each_runs_dead_letters_back_into_its_own_stream(
    redis_cluster, key_prefix, tmp_path
) -> None:
    """A sink refuses two runs' items: they are dead-lettered in each run's slot and counted
    `store_failed`; the runs end (out of the active set). `requeue_dead` moves them back to
    each run's stream, takes them off `store_failed` and puts the runs in `runs:storing`, so
    a drainer stores them all once the sink is fixed."""
    client = cast(redis.Redis, cluster_client(redis_cluster.url))
    ks = Keyspace(key_prefix)
    state = RunState(client, _settings(redis_cluster.url, key_prefix))
    rids = [_rid(), _rid()]
    for rid in rids:
        client.sadd(ks.active_runs, rid)
        client.hset(ks.counters(rid), mapping={"items": 2})
        for i in range(2):
            client.xadd(ks.run_outbox(rid), _entry(rid, i))  # type: ignore[arg-type]
    refusing = ClusterDrainer(client, key_prefix, [Refusing()], hooks=[], runs_hooks=[],
                              consumer="c")  # fmt: skip
    assert refusing.drain_once() == 4 and refusing.stats["dead"] == 4
    assert [client.xlen(ks.run_outbox_dead(r)) for r in rids] == [2, 2]
    assert [state.counters(r)["store_failed"] for r in rids] == [2, 2]
    client.srem(ks.active_runs, *rids)  # the runs ended: the drainer noted their dead letters
    dead_runs = cast("set[bytes]", client.smembers(ks.outbox_dead_runs))
    assert {m.decode() for m in dead_runs} == set(rids)
    assert backlog(client, key_prefix)["dead"] == 4  # found without a SCAN
    assert requeue_dead(client, key_prefix, count=3) == 3
    assert requeue_dead(client, key_prefix) == 1
    assert [client.xlen(ks.run_outbox_dead(r)) for r in rids] == [0, 0]
    assert [client.xlen(ks.run_outbox(r)) for r in rids] == [2, 2]
    assert [state.counters(r)["store_failed"] for r in rids] == [0, 0]
    assert set(rids) <= {m.decode() for m in cast("set[bytes]", client.smembers(ks.storing_runs))}
    sink = JsonlSink(tmp_path, fsync=False)
    fixed = ClusterDrainer(client, key_prefix, [sink], hooks=[], runs_hooks=[], consumer="d")
    assert fixed.drain_once() == 4
    assert sorted(r["item"]["k"] for r in iter_records("thing", tmp_path)) == sorted(
        f"{r}-{i}" for r in rids for i in range(2)
    )
    assert [state.counters(r)["stored"] for r in rids] == [2, 2]
    assert backlog(client, key_prefix)["length"] == 0
    assert not client.smembers(ks.outbox_dead_runs)  # no dead letters left: forgotten


def test_a_cancelled_runs_items_are_all_stored(redis_cluster, key_prefix, tmp_path) -> None:
    """A run commits items, is paused, its other task parked, then cancelled: the cancel
    ends it (nothing in flight). Its items wait in its own stream, which no drainer has
    seen yet; a reader of the storing runs (`control.sh runs`) comes first. A new drainer
    still finds the run in `runs:storing` and stores every item; the run is compacted."""
    client = cast(redis.Redis, cluster_client(redis_cluster.url))
    state = RunState(client, _settings(redis_cluster.url, key_prefix))
    rid = _rid()
    state.create_run(rid, "c", b"{}", 5)
    msgs = [orjson.dumps({"id": f"t{i}", "task": "demo.t", "params": {},
                          "meta": {"run": rid, "step": "s"}}) for i in range(2)]  # fmt: skip
    staging = state.kids_key(rid, "client")
    state.enqueue_and_release(rid, "s", msgs, staging)
    client.delete(staging)
    assert state.pause(rid).was == "running"
    entries = [_entry(rid, i) for i in range(3)]
    assert state.begin(rid, "t0", 0).deliveries == 1
    res = state.commit(rid=rid, tid="t0", step="s", outcome="succeeded", n_items=3,
                       entries=entries, kids=())  # fmt: skip
    assert res is not None and res.outstanding == 1
    assert state.park(rid, "t1", msgs[1], 0, counted=False) == 1
    out = state.cancel(rid)
    assert (out.was, out.outstanding) == ("running", 0)
    assert state.info(rid)["status"] == "cancelled"
    assert rid not in state.active_runs() and rid not in state.storing_runs()
    assert client.sismember(state.storing_key, rid)  # kept: its items wait
    compacted: list[str] = []
    d = ClusterDrainer(client, key_prefix, [JsonlSink(tmp_path, fsync=False)], hooks=[],
                       runs_hooks=[lambda rids: compacted.extend(state.compact_settled(rids))],
                       consumer="d")  # fmt: skip
    assert d.drain_once() == 1  # the commit's entries of one type went in as one
    assert sorted(r["item"]["k"] for r in iter_records("thing", tmp_path)) == [
        f"{rid}-{i}" for i in range(3)
    ]
    assert state.counters(rid)["stored"] == 3 and compacted == [rid]
    assert not client.exists(state.ks.run_outbox(rid))
    state.storing_runs()
    d._next_refresh = 0.0
    assert d.drain_once() == 0
    assert not client.sismember(state.storing_key, rid)  # stored: no longer read


def test_the_alert_rules_and_the_exporter_see_every_runs_stream(
    redis_cluster, redis_url, key_prefix, tmp_path
) -> None:
    client = cast(redis.Redis, cluster_client(redis_cluster.url))
    ks = Keyspace(key_prefix)
    s = _settings(redis_cluster.url, key_prefix, broker=redis_url)
    for n in (2, 3):
        rid = _rid()
        client.sadd(ks.active_runs, rid)
        for i in range(n):
            client.xadd(ks.run_outbox(rid), _entry(rid, i), id=f"{1000 + i}-0")  # type: ignore[arg-type]
    cfg = parse_config({"rules": [
        {"name": "backlog", "kind": "outbox_backlog", "above": 4},
        {"name": "age", "kind": "outbox_age", "above": 3600},
    ]})  # fmt: skip
    ev = Evaluator(client, cfg, s)
    fired = ev.tick(now=1000.0, force=True)
    assert fired is not None
    assert sorted((t.action, t.rule) for t in fired) == [("fire", "age"), ("fire", "backlog")]
    fams = {m.name: m for m in ChaincrawlCollector(client, s).collect()}
    assert fams["chaincrawl_outbox_backlog"].samples[0].value == 5
    assert fams["chaincrawl_outbox_oldest_age_seconds"].samples[0].value > 3600


def test_an_idle_cluster_drainer_polls_less_and_a_read_with_entries_resets_it(
    redis_cluster, key_prefix
) -> None:
    """Empty reads space the next ones out (0.2 s doubling to 1 s); a call before the next
    read is due waits without reading; a read that returns entries makes the next one
    immediate."""
    client = cast(redis.Redis, cluster_client(redis_cluster.url))
    ks = Keyspace(key_prefix)
    rid = _rid()
    client.sadd(ks.active_runs, rid)
    d = ClusterDrainer(client, key_prefix, [], hooks=[], runs_hooks=[], consumer="c")
    d.ensure_group()
    reads: list[int] = []
    real = d._read_all

    def counting(start: str, count: int) -> list[Any]:
        reads.append(count)
        return real(start, count)

    d._read_all = counting  # type: ignore[method-assign]
    assert d.read(10, 1) == [] and len(reads) == 1 and d._poll == POLL_MIN
    polls = []
    for _ in range(4):  # each empty read doubles the time to the next, up to POLL_MAX
        d._next_poll = 0.0
        assert d.read(10, 1) == []
        polls.append(d._poll)
    assert polls == [0.4, 0.8, POLL_MAX, POLL_MAX] and len(reads) == 5
    d._next_poll = time.monotonic() + 60
    assert d.read(10, 1) == [] and len(reads) == 5  # not due: a short wait, no read
    client.xadd(ks.run_outbox(rid), _entry(rid, 0))  # type: ignore[arg-type]
    d._next_poll = 0.0
    assert len(d.read(10, 1)) == 1 and d._poll == 0.0  # entries: the next read is immediate
    assert d.read(10, 1) == [] and len(reads) == 7
    assert d.read(10, None) == [] and len(reads) == 8  # drain_once's reads are never skipped


class _fresh_settings:
    """Settings and clients read again from the environment, and again on leaving."""

    def __enter__(self) -> None:
        reset_settings()
        reset_clients()

    def __exit__(self, *exc: object) -> None:
        reset_settings()
        reset_clients()


def test_status_runs_and_the_exporter_on_a_cluster_state_store(
    redis_cluster, redis_url, key_prefix
) -> None:
    """`control.sh status` (the snapshot and its rendering), `control.sh runs` and the
    exporter on a cluster: a running run, a run storing its items, a cancelled run whose
    items wait and one of whose items a sink refused; task metrics and a pool. Every run is
    listed, and the outbox line counts every run's stream and dead letters."""
    client = cast(redis.Redis, cluster_client(redis_cluster.url))
    s = _settings(redis_cluster.url, key_prefix, broker=redis_url)
    state = RunState(client, s)
    ks = state.ks
    chain = orjson.dumps({"name": "shop_chain",
                          "root": {"id": "web.listing", "task": "shop.web.listing"}})  # fmt: skip
    running, storing, cancelled = _rid(), _rid(), _rid()
    for rid in (running, storing, cancelled):
        state.create_run(rid, "shop_chain", chain, 5)
        state.add_dispatched(rid, "web.listing", 1)
    for rid in (storing, cancelled):
        entry = {**_entry(rid, 0, "web.listing"), "task": "shop.web.listing"}
        assert state.begin(rid, "t", 0).deliveries == 1
        state.commit(rid=rid, tid="t", step="web.listing", outcome="succeeded", n_items=1,
                     entries=[entry], kids=())  # fmt: skip
    client.hset(state.run_key(cancelled), "status", "cancelled")
    client.xadd(ks.run_outbox_dead(cancelled), {**_entry(cancelled, 1), "error": "refused"})  # type: ignore[dict-item]
    record(client, s, "shop.web.listing", ok=2, items=2)
    health.report(client, health.PoolHealth("cookie:shop", size=1), s)
    snap = msnap.snapshot(s, client, workers_timeout=None)
    assert {r["run_id"] for r in snap["active_runs"]} == {running, storing}
    assert (snap["outbox"]["length"], snap["outbox"]["dead"]) == (2, 1)
    assert snap["tasks"]["shop.web.listing"]["succeeded"] == 2
    assert snap["pools"][0]["name"] == "cookie:shop"
    console = Console(record=True, width=160, color_system=None)
    console.print(cli_status.render(snap, None))
    text = console.export_text()
    assert "outbox backlog: 2" in text and "refused items: 1" in text
    runs = {r["run_id"]: r["status"] for r in ms.recent_runs(client, s)}
    assert runs == {running: "running", storing: "storing", cancelled: "cancelled"}
    fams = {m.name: m for m in ChaincrawlCollector(client, s).collect()}
    assert fams["chaincrawl_up"].samples[0].value == 1
    assert fams["chaincrawl_outbox_backlog"].samples[0].value == 2
    assert fams["chaincrawl_outbox_dead"].samples[0].value == 1
    storing_now = {smp.labels["run"]: smp.value for smp in fams["chaincrawl_run_storing"].samples}
    assert storing_now[storing] == 1 and storing_now[running] == 0
