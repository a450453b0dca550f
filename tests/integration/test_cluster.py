"""The state store on a real Redis Cluster (3 masters, a replica each), the broker apart:
every ledger script on one slot, exact counts, a master killed mid-crawl, real workers.

A commit hands a run's items to the run's own outbox stream (the global one is on another
slot), which the `ClusterDrainer` reads: the in-process crawls (`Crawl`: the calls a worker
makes, so a kill lands between known commits) are checked by their ledger and their stream,
then drained; the real workers' runs end `done` with every item in the JSONL sink once.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import redis

import chains
import worker
from chains.sweeper import Sweeper
from config import Settings, get_settings, reset_settings
from external_interface.dedup import MemoryDedup, RedisDedup, Status
from external_interface.storage.outbox import ClusterDrainer, Drainer, drainer_class
from external_interface.storage.sinks.jsonl import JsonlSink, iter_records
from ledger.state import Kid, RunState
from tests.conditions import wait_for
from tests.testsite import chains as tchains
from tests.testsite.server import PAGES, PER_PAGE, REVIEW_PAGES, REVIEWS_PER_PAGE
from utils.keyspace import Keyspace
from utils.redis import NotReplicated, cluster_client, get_redis, reset_clients
from utils.servers import RedisClusterServer, wait_aof_written
from utils.slots import lost_ranges

pytestmark = pytest.mark.integration

FANOUT = (3, 4, 5)  # root -> 3 lists -> 4 pages each -> 5 details each: 1 + 3 + 12 + 60 tasks
TOTAL = 1 + 3 + 12 + 60


def _settings(url: str, prefix: str, **kw: Any) -> Settings:
    return Settings(redis_url=url, broker_url="redis://127.0.0.1:1/0", key_prefix=prefix, **kw)


def _msg(rid: str, step: str, depth: int, n: int) -> bytes:
    return orjson.dumps({"id": uuid.uuid4().hex, "task": "t", "params": {"d": depth, "n": n},
                         "meta": {"run": rid, "step": step}})  # fmt: skip


class Crawl:
    """A run of the FANOUT tree driven like a worker: begin, commit (one item entry a task,
    its children staged), send what was staged; a state-store error puts the task back."""

    def __init__(self, state: RunState, cap: int = 0) -> None:
        self.state = state
        self.rid = uuid.uuid4().hex[:12]
        self.queue: deque[dict[str, Any]] = deque()
        self.errors: list[str] = []
        state.create_run(self.rid, "tree", b"{}", 5, cap)
        staging = state.kids_key(self.rid, "client")
        state.enqueue_and_release(self.rid, "d0", [_msg(self.rid, "d0", 0, 0)], staging)
        self.queue.extend(orjson.loads(m) for m in state.r.lrange(staging, 0, -1))
        state.r.delete(staging)

    def step(self) -> bool:
        """One task; False when nothing is left to run."""
        if not self.queue:
            return False
        msg = self.queue.popleft()
        tid, depth = msg["id"], msg["params"]["d"]
        try:
            begun = self.state.begin(self.rid, tid, 0)
            if begun.committed:  # a redelivery: send what is still staged
                staged = self.state.staged(self.rid, tid)
            else:
                kids = []
                if depth < len(FANOUT):
                    kids = [Kid(f"d{depth + 1}", "t", {"d": depth + 1, "n": i},
                                {"run": self.rid, "step": f"d{depth + 1}"}, uuid.uuid4().hex)
                            for i in range(FANOUT[depth])]  # fmt: skip
                entry = {"run": self.rid, "step": f"d{depth}", "task": tid, "type": "page",
                         "key": "[]", "items": orjson.dumps([{"tid": tid}])}  # fmt: skip
                res = self.state.commit(rid=self.rid, tid=tid, step=f"d{depth}",
                                        outcome="succeeded", n_items=1, entries=[entry],
                                        kids=kids)  # fmt: skip
                staged = res.staged if res is not None else []
            self.queue.extend(orjson.loads(m) for m in staged)
            self.state.clear_kids(self.rid, tid)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.ClusterError) as exc:  # fmt: skip
            self.errors.append(type(exc).__name__)  # the message is requeued, not acked
            self.queue.append(msg)
            time.sleep(0.1)
        return True


def _check_complete(state: RunState, rid: str) -> None:
    c = state.counters(rid)
    want = {"outstanding": 0, "dispatched": TOTAL, "succeeded": TOTAL, "items": TOTAL,
            "d3:succeeded": 60, "d0:dispatched": 1}  # fmt: skip
    assert {k: c.get(k, 0) for k in want} == want
    assert state.info(rid)["status"] == "done"  # its tasks: all finished
    assert state.status(rid) == "storing"  # its items: handed off, not stored (no drainer yet)
    assert state.r.scard(state.ks.run(rid, "done")) == TOTAL  # every task committed once
    assert rid not in state.active_runs() and rid in state.storing_runs()
    stream = state.ks.run_outbox(rid)
    entries = cast("list[tuple[bytes, dict[bytes, bytes]]]", state.r.xrange(stream, "-", "+"))
    tids = [orjson.loads(fields[b"items"])[0]["tid"] for _, fields in entries]
    assert len(tids) == TOTAL and len(set(tids)) == TOTAL  # none missing, none twice


def test_a_runs_keys_share_one_slot_and_runs_spread_over_the_masters(redis_cluster) -> None:
    client = cluster_client(redis_cluster.url)
    ks = Keyspace("tc")
    slots = set()
    for _ in range(30):
        rid = uuid.uuid4().hex[:12]
        keys = [ks.run(rid), ks.counters(rid), ks.done(rid, "t"), ks.staged(rid), ks.kids(rid, "c"),
                ks.deliveries(rid, "t", 0), ks.uniq_prefix(rid) + "s", ks.run_outbox(rid)]  # fmt: skip
        found = {client.keyslot(k) for k in keys}
        assert len(found) == 1
        slots |= found
    owners = {client.get_node_from_key(ks.run(str(s))).name for s in range(100)}
    assert len(owners) == 3 and len(slots) > 20
    assert (
        client.keyslot(ks.done("", "a"))
        == client.keyslot(ks.kids("", "b"))
        == client.keyslot(ks.run_outbox(""))
    )  # tasks without a run commit together


def test_new_runs_are_placed_on_the_master_with_the_fewest_active_runs(
    redis_cluster, key_prefix
) -> None:
    client = cluster_client(redis_cluster.url)
    state = RunState(cast(redis.Redis, client), _settings(redis_cluster.url, key_prefix))
    masters: Counter[str] = Counter()
    for _ in range(12):
        rid = state.new_run_id()
        state.create_run(rid, "c", b"{}", 5)
        masters[state._master(rid)] += 1
    assert sorted(masters.values()) == [4, 4, 4]  # random ids: 12 runs rarely split evenly
    ended = [r for r in state.active_runs() if state._master(r) == next(iter(masters))]
    client.srem(state.active_key, *ended)  # one master's runs finished: the next go there
    nxt = [state.new_run_id() for _ in range(3)]
    assert {state._master(r) for r in nxt} == {next(iter(masters))}
    one = RunState(redis.Redis(port=1), _settings("redis://127.0.0.1:1/0", key_prefix))
    assert len(one.new_run_id()) == 16  # one Redis: a plain random id, nothing read


def test_a_crawl_on_the_cluster_has_exact_counts(redis_cluster, key_prefix) -> None:
    state = RunState(
        cast(redis.Redis, cluster_client(redis_cluster.url)),
        _settings(redis_cluster.url, key_prefix),
    )
    crawl = Crawl(state, cap=7)  # the cap sends children through the waiting list too
    while crawl.step():
        pass
    assert crawl.errors == []
    _check_complete(state, crawl.rid)


def test_a_finished_run_is_compacted_on_the_cluster(redis_cluster, key_prefix) -> None:
    """A run with nothing to store (no items) is complete when its tasks are: compaction drops
    its done set, `unique` set and delivery counters by their tagged names, in its slot."""
    state = RunState(
        cast(redis.Redis, cluster_client(redis_cluster.url)),
        _settings(redis_cluster.url, key_prefix),
    )
    rid = uuid.uuid4().hex[:12]
    chain = {"root": {"id": "s", "task": "t", "then": [{"id": "k", "task": "t"}]}}
    state.create_run(rid, "c", orjson.dumps(chain), 5)
    state.add_dispatched(rid, "s", 1)
    kid = Kid("k", "t", {}, {"run": rid, "step": "k"}, uuid.uuid4().hex, uniq="u1")
    assert state.begin(rid, "a", 0).deliveries == 1
    res = state.commit(rid=rid, tid="a", step="s", outcome="succeeded", n_items=0, entries=(),
                       kids=[kid], forget=[state.deliveries_key(rid, "a", 0)])  # fmt: skip
    assert res is not None and res.outstanding == 1
    state.clear_kids(rid, "a")
    res = state.commit(rid=rid, tid=kid.task_id, step="k", outcome="succeeded", n_items=0,
                       entries=(), kids=())  # fmt: skip
    assert res is not None and res.outstanding == 0
    assert state.status(rid) == "done" and rid not in state.storing_runs()
    bookkeeping = [state.done_key(rid, ""), state.uniq_key(rid, "k"),
                   state.deliveries_key(rid, "a", 0)]  # fmt: skip
    assert [state.r.exists(k) for k in bookkeeping] == [1, 1, 0]  # the counter went with it
    assert state.compact_settled([rid]) == [rid]
    assert [state.r.exists(k) for k in bookkeeping] == [0, 0, 0]
    assert state.r.exists(state.run_key(rid)) and state.counters(rid)["succeeded"] == 2


def _lines(root: Any, rid: str | None = None) -> Counter[tuple[str, bytes]]:
    """(type, item) -> lines in an append-mode JSONL sink under `root` (of run `rid`)."""
    got: Counter[tuple[str, bytes]] = Counter()
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []:
        for rec in iter_records(folder.name, root):
            if rid is None or rec["run"] == rid:
                got[(folder.name, orjson.dumps(rec["item"], option=orjson.OPT_SORT_KEYS))] += 1
    return got


def test_the_cluster_drainer_stores_a_crawl_once_and_the_run_ends_done(
    redis_cluster, key_prefix, tmp_path
) -> None:
    """A drainer dies after writing a batch to the sink, before acknowledging it; another
    claims its entries: every item is in the JSONL sink once, `stored` counts each once, the
    run leaves `storing` for `done` and is compacted (its stream with it)."""
    client = cluster_client(redis_cluster.url)
    settings = _settings(redis_cluster.url, key_prefix)
    state = RunState(cast(redis.Redis, client), settings)
    crawl = Crawl(state)
    while crawl.step():
        pass
    _check_complete(state, crawl.rid)
    assert (
        drainer_class(cast(redis.Redis, client)) is ClusterDrainer
        and drainer_class(redis.Redis()) is Drainer
    )

    def drainer(consumer: str, **kw: Any) -> ClusterDrainer:
        sink = JsonlSink(tmp_path / "items", mode="append", fsync=False)
        return ClusterDrainer(client, key_prefix, [sink], batch=20, consumer=consumer,
                              hooks=[], own_sinks=True, **kw)  # fmt: skip

    dying = drainer("dying", runs_hooks=[])
    dying.ensure_group()
    held = dying.read(20, None)
    assert len(held) >= 20 and all(e.id.startswith(f"{crawl.rid}/") for e in held)

    def crash(*_a: Any, **_k: Any) -> None:
        raise SystemExit("killed between the sink and the acknowledgement")

    dying._acknowledge = crash  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        dying.flush(held)
    assert len(_lines(tmp_path / "items")) == len(held)  # written, not acknowledged
    assert state.counters(crawl.rid).get("stored", 0) == 0
    compacted: list[str] = []
    heir = drainer("heir", claim_idle=0,
                   runs_hooks=[lambda rids: compacted.extend(state.compact_settled(rids))])  # fmt: skip
    assert heir.drain_once(claim=True) == TOTAL
    heir.router.close()
    got = _lines(tmp_path / "items", crawl.rid)
    assert sum(got.values()) == TOTAL and max(got.values()) == 1  # none missing, none twice
    c = state.counters(crawl.rid)
    assert c["stored"] == c["items"] == TOTAL and c["d3:stored"] == 60
    assert compacted == [crawl.rid] and not client.exists(state.ks.run_outbox(crawl.rid))
    heir._next_refresh = 0.0
    assert heir.drain_once(claim=True) == 0  # the compacted run's stream is not made again
    assert not client.exists(state.ks.run_outbox(crawl.rid))
    assert not client.sismember(state.storing_key, crawl.rid)  # and the run is not read again
    assert state.status(crawl.rid) == "done" and crawl.rid not in state.storing_runs()


def test_equal_entry_ids_of_two_runs_streams_are_both_stored(
    redis_cluster, key_prefix, tmp_path
) -> None:
    """Two runs' streams (on two slots) hold an entry of the same id: the sink is given
    `<run>/<id>`, so the JSONL sink's memory of written entries does not skip the second;
    entries of tasks without a run are drained too."""
    client = cluster_client(redis_cluster.url)
    ks = Keyspace(key_prefix)
    rids = [uuid.uuid4().hex[:12] for _ in range(2)]
    for rid in rids:
        client.sadd(ks.active_runs, rid)
        fields = {"run": rid, "step": "s", "task": "t", "type": "thing", "key": "[\"k\"]",
                  "items": orjson.dumps([{"k": rid}])}  # fmt: skip
        client.xadd(ks.run_outbox(rid), fields, id="5-1")  # type: ignore[arg-type]
    client.xadd(ks.run_outbox(""), {"run": "", "step": "", "task": "", "type": "thing",
                                    "key": '["k"]', "items": b'[{"k": "norun"}]'}, id="5-1")  # fmt: skip
    sink = JsonlSink(tmp_path, mode="append", fsync=False)
    d = ClusterDrainer(client, key_prefix, [sink], hooks=[], runs_hooks=[], consumer="c")
    assert d.drain_once() == 3
    assert d.drain_once() == 0  # the same entries delivered again are skipped: acknowledged
    assert sorted(r["item"]["k"] for r in iter_records("thing", tmp_path)) == sorted(
        [*rids, "norun"]
    )
    entries = sorted(r["entry"] for r in iter_records("thing", tmp_path))
    assert entries == sorted(["/5-1", *(f"{rid}/5-1" for rid in rids)])
    assert [RunState(cast(redis.Redis, client), _settings(redis_cluster.url, key_prefix))
            .counters(r)["stored"] for r in rids] == [1, 1]  # fmt: skip
    assert [client.xlen(ks.run_outbox(r)) for r in [*rids, ""]] == [0, 0, 0]


def test_a_stream_seen_is_drained_after_its_run_leaves_the_sets(
    redis_cluster, key_prefix, tmp_path
) -> None:
    """A cancelled run leaves `runs:active` with items still in its stream: a drainer that
    saw the stream reads it until it is empty."""
    client = cluster_client(redis_cluster.url)
    ks = Keyspace(key_prefix)
    rid = uuid.uuid4().hex[:12]
    client.sadd(ks.active_runs, rid)
    d = ClusterDrainer(client, key_prefix, [JsonlSink(tmp_path, fsync=False)], hooks=[],
                       runs_hooks=[], consumer="c")  # fmt: skip
    assert d.drain_once() == 0  # the run seen, its stream empty
    client.xadd(ks.run_outbox(rid), {"run": rid, "step": "s", "task": "t", "type": "thing",
                                     "key": '["k"]', "items": b'[{"k": 1}]'})  # fmt: skip
    client.srem(ks.active_runs, rid)
    d._next_refresh = 0.0
    assert d.drain_once() == 1 and client.xlen(ks.run_outbox(rid)) == 0
    d._next_refresh = 0.0
    d.streams()
    assert ks.run_outbox(rid) not in d.streams()  # empty now: no longer read


def test_pause_cancel_and_runless_commits_on_the_cluster(redis_cluster, key_prefix) -> None:
    state = RunState(
        cast(redis.Redis, cluster_client(redis_cluster.url)),
        _settings(redis_cluster.url, key_prefix),
    )
    crawl = Crawl(state)
    crawl.step()  # the root: three children queued
    assert state.pause(crawl.rid).was == "running"
    msg = crawl.queue.popleft()
    body = orjson.dumps(msg)
    assert state.park(crawl.rid, msg["id"], body, 0, counted=False) == 1
    assert state.waiting(crawl.rid) == 1
    staging = state.kids_key(crawl.rid, "client-resume")
    assert state.resume(crawl.rid, staging).released == 1
    crawl.queue.extend(orjson.loads(m) for m in state.r.lrange(staging, 0, -1))
    state.r.delete(staging)
    assert state.cancel(crawl.rid).was == "running"
    while crawl.step():  # the rest is skipped at begin in a worker; here it commits no kids
        pass
    assert crawl.rid not in state.active_runs() and crawl.rid not in state.storing_runs()
    assert state.info(crawl.rid)["status"] == "cancelled"
    calls: list[Any] = []
    for tid in ("x1", "x2"):  # two tasks without a run in one script call
        calls.append(state.commit_call(rid="", tid=tid, step="s", outcome="succeeded"))
    assert all(r is not None for r in state.run_commits(calls))
    assert state.run_commits(calls) == [None, None]  # each committed once


def test_a_master_killed_mid_crawl_loses_no_acknowledged_commit(tmp_path, key_prefix) -> None:
    """With REDIS_WAIT_REPLICAS=1 a commit counts (children sent, message acked) only once a
    replica holds it, so the replica promoted by the cluster's failover has every commit
    whose task went on: the run completes with 0 missing and 0 duplicates. While the promoted
    master has no replica, commits of its slots are refused (requeued), not risked: the
    killed node, started again, comes back as its replica and the crawl goes on."""
    with RedisClusterServer(tmp_path, node_timeout_ms=1000) as cluster:
        settings = _settings(cluster.url, key_prefix, redis_wait_replicas=1,
                             redis_wait_timeout=0.5)  # fmt: skip
        client = cluster_client(cluster.url)
        state = RunState(cast(redis.Redis, client), settings)
        crawl = Crawl(state)
        victim = cluster.node_for_port(client.get_node_from_key(state.run_key(crawl.rid)).port)
        for _ in range(TOTAL // 3):
            crawl.step()
        victim.kill()  # SIGKILL the master of the run's slot mid-crawl
        deadline = time.monotonic() + 60
        restarted = False
        while crawl.step():
            assert time.monotonic() < deadline, f"stuck after {len(crawl.errors)} errors"
            if not restarted and len(cluster.masters()) == 3:  # the replica took over
                victim.start()
                restarted = True
        assert crawl.errors, "the kill was felt"
        assert restarted and victim.client().info("replication")["role"] == "slave"
        _check_complete(state, crawl.rid)


def test_a_commit_no_replica_confirms_is_refused(redis_server, key_prefix) -> None:
    """One node without a replica: WAIT 1 times out, the commit raises (the worker requeues
    its message); the redelivery finds it committed and sends what it staged."""
    state = RunState(redis.Redis.from_url(redis_server.url),
                     _settings(redis_server.url, key_prefix, redis_wait_replicas=1,
                               redis_wait_timeout=0.05))  # fmt: skip
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 1)
    kid = Kid("s", "t", {}, {"run": "r1"}, "k1")
    with pytest.raises(NotReplicated):
        state.commit(rid="r1", tid="a", step="s", outcome="succeeded", n_items=0, entries=(),
                     kids=[kid])  # fmt: skip
    assert state.begin("r1", "a", 0).committed
    assert [k["id"] for k in state.staged_kids("r1", "a")] == ["k1"]


def test_dedup_buckets_spread_over_the_masters_with_exact_answers(
    redis_cluster, key_prefix
) -> None:
    client = cluster_client(redis_cluster.url)
    store = RedisDedup("shop:item", cast(redis.Redis, client), prefix=key_prefix, capacity=100_000)
    twin = MemoryDedup()
    ids = [f"item-{i}" for i in range(20_000)]
    assert store.mark_many(ids) == twin.mark_many(ids)
    probe = [f"item-{i}" for i in range(10_000, 30_000)]  # half seen, half new
    got = [s.status for s in store.check_many(probe)]
    assert got == [s.status for s in twin.check_many(probe)]
    assert got.count(Status.NEW) == 10_000
    assert store.stats()["records"] == 20_000
    per_master = [n.client().dbsize() for n in redis_cluster.masters()]
    assert all(n > 10 for n in per_master), per_master  # ~100 buckets, a third on each
    store.clear()
    assert store.stats()["records"] == 0


def test_the_sweeper_reads_ledgers_on_the_cluster_and_queues_on_the_broker(
    redis_cluster, redis_server, key_prefix
) -> None:
    """The broker apart (a standalone Redis), the state on the cluster: a task's children
    staged by a commit whose own message is gone are found nowhere and re-sent; children
    staged by a task still in the broker are left to its redelivery."""
    settings = Settings(redis_url=redis_cluster.url, broker_url=redis_server.url,
                        key_prefix=key_prefix)  # fmt: skip
    state = RunState(cast(redis.Redis, cluster_client(redis_cluster.url)), settings)
    broker = redis.Redis.from_url(redis_server.url)
    crawl = Crawl(state)
    seed = crawl.queue.popleft()
    kids = [Kid("d1", "t", {"d": 1, "n": i}, {"run": crawl.rid, "step": "d1"}, uuid.uuid4().hex)
            for i in range(3)]  # fmt: skip
    # the seed commits three children; its worker dies before sending them, its message gone
    state.commit(rid=crawl.rid, tid=seed["id"], step="d0", outcome="succeeded", n_items=0,
                 entries=(), kids=kids)  # fmt: skip
    state.r.hset(state.run_key(crawl.rid), "last", f"{time.time() - 60:.3f}")  # stalled
    sent: list[dict[str, Any]] = []
    sw = Sweeper(state.r, broker, f"{key_prefix}:q:", sent.append, settings, interval=1,
                 stall=30, confirm=0)  # fmt: skip
    assert sw.sweep_once() == 3
    assert sorted(k["id"] for k in sent) == sorted(k.task_id for k in kids)
    assert state.counters(crawl.rid)["resent"] == 3
    # now the seed's message is back in the broker: its staged children wait for it
    other = uuid.uuid4().hex
    state.r.hset(state.staged_key(crawl.rid), other, kids[0].task_id)
    broker.lpush(f"{key_prefix}:q:testsite", orjson.dumps({"headers": {"id": other}}))
    state.r.hset(state.ledger_key(crawl.rid), kids[0].task_id, kids[0].encode())
    state.r.hset(state.run_key(crawl.rid), "last", f"{time.time() - 60:.3f}")
    sent.clear()
    sw.check_all = "test"
    sw.sweep_once()
    assert kids[0].task_id not in [k["id"] for k in sent]


@pytest.fixture
def on_cluster(cc_env, redis_cluster, redis_server, tmp_path) -> Iterator[dict[str, str]]:
    """This process and the workers it starts with the state on the cluster and the broker on
    the session's standalone Redis, items in an append-mode JSONL sink of the test's own (every
    write a line: a duplicate would show); the session's settings back afterwards."""
    env = {"CHAINCRAWL_REDIS_URL": redis_cluster.url, "CHAINCRAWL_BROKER_URL": redis_server.url,
           "CHAINCRAWL_KEY_PREFIX": f"itc{uuid.uuid4().hex[:6]}",
           "CHAINCRAWL_JSONL_DIR": str(tmp_path / "items"),
           "CHAINCRAWL_JSONL_MODE": "append"}  # fmt: skip
    os.environ.update(env)
    reset_settings()
    reset_clients()
    worker.configure(get_settings())
    try:
        yield env
    finally:
        for k in env:
            if k in cc_env:
                os.environ[k] = cc_env[k]
            else:
                os.environ.pop(k, None)
        reset_settings()
        reset_clients()
        worker.configure(get_settings())


def test_workers_crawl_the_test_site_with_the_state_on_the_cluster(on_cluster, start_worker):
    """Real workers, a real chain: the ledger completes with exact counts, every item is
    stored once from the run's outbox stream, and the run ends `done`."""
    start_worker(concurrency=4, **on_cluster)
    start_worker(pool="threads", concurrency=4, **on_cluster)
    run = chains.run(tchains.deep(), seeds=[{"page": 1}])
    p = run.wait(timeout=120)
    assert p.status == "done" and p.complete, p.as_dict()
    _check_crawled(RunState(get_redis(), get_settings()), run.run_id, on_cluster)


def test_a_worker_killed_mid_crawl_on_the_cluster_loses_no_task(on_cluster, start_worker):
    """The worker-kill scenario with the state on the cluster: SIGKILL with tasks in flight;
    the broker Redis gives its messages back (dead owner), the ledger finishes exactly, and
    the entries its drainer held are claimed by the next: every item stored once."""
    w1 = start_worker(concurrency=8, **on_cluster)
    run = chains.run(tchains.three_step(delay=0.4), seeds=[{"page": 1}])
    state = RunState(get_redis(), get_settings())
    deadline = time.monotonic() + 30
    while state.counters(run.run_id).get("succeeded", 0) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    w1.kill()  # SIGKILL: tasks in flight are neither finished nor acknowledged
    assert state.info(run.run_id)["status"] == "running"
    start_worker(concurrency=8, **on_cluster)
    p = run.wait(timeout=150)
    assert p.status == "done" and p.complete, p.as_dict()
    _check_crawled(state, run.run_id, on_cluster)


def _check_crawled(state: RunState, rid: str, env: dict[str, str]) -> None:
    """The test site's chain (deep or three_step: the same tasks and items) done exactly: every
    task once, every item stored once (a line each in the JSONL sink), the run `done` and
    compacted, its outbox stream gone with it."""
    assert state.status(rid) == "done"
    assert rid not in state.active_runs() and rid not in state.storing_runs()
    c = state.counters(rid)
    tasks = PAGES + ENTRIES + ENTRIES * REVIEW_PAGES
    items = ENTRIES * (2 + REVIEW_PAGES * REVIEWS_PER_PAGE)
    got_counts = [c.get(k, 0) for k in ("outstanding", "dispatched", "succeeded", "failed")]
    assert got_counts == [0, tasks, tasks, 0]
    assert c["items"] == items and c["stored"] == items and c.get("store_failed", 0) == 0
    got = _lines(Path(env["CHAINCRAWL_JSONL_DIR"]), rid)
    assert sum(got.values()) == items and max(got.values()) == 1  # none missing, none twice
    deadline = time.monotonic() + 30  # compacted by the drainer that stored its last items
    while state.info(rid).get("compacted") is None:
        assert time.monotonic() < deadline, state.info(rid)
        time.sleep(0.2)
    assert not state.r.exists(state.ks.run_outbox(rid))


ENTRIES = PAGES * PER_PAGE


def _storing_run(
    client: Any, state: RunState, ks: Keyspace, rid: str, items: int
) -> dict[str, str]:
    """A run done crawling with `items` items counted, storing, its outbox holding one entry
    (`{"k": 1}`); the entry's fields without its items, to add more."""
    state.create_run(rid, "tree", b"{}", 5)
    client.hset(state.run_key(rid), "status", "done")
    client.hset(state.counters_key(rid), "items", items)
    client.sadd(ks.storing_runs, rid)
    entry = {"run": rid, "step": "s", "task": "t", "type": "thing", "key": '["k"]'}
    client.xadd(ks.run_outbox(rid), {**entry, "items": b'[{"k": 1}]'})
    return entry


def _kill_master(cluster: RedisClusterServer, port: int) -> list[Any]:
    """Kill the master on `port` and its replica (its slots lost); the nodes, to start again.

    Each node has first written every write so far to its append-only file
    (`wait_aof_written`): on a busy disk a SIGKILL right after the writes lost the last of
    them (the lost run's stream, its pending entry), and its entry, stored once the nodes
    were back, was counted nowhere (`KeyError: 'stored'`)."""
    nodes = [n for n in cluster.nodes
             if n.port == port or n.client().info("replication").get("master_port") == port]  # fmt: skip
    for n in nodes:
        with n.client() as c:
            wait_aof_written(c)
    for n in nodes:
        n.kill()
    return nodes


def test_a_lost_range_stops_the_storage_of_no_run_on_another_master(tmp_path, key_prefix) -> None:
    """The range lost is the one of redis-py's default node (the master of slot 0, which it
    asked the keys of every script call in a pipeline) and holds the drainer's global keys
    (the sinks' errors, the runs with dead letters): a run on another master still has its
    items stored and counted (the acknowledgement, on the run's slot, waits on neither) and
    ends `done`; its dead letter is noted once the range returns."""
    with RedisClusterServer(tmp_path / "cluster", node_timeout_ms=1000,
                            full_coverage=False) as cluster:  # fmt: skip
        client = cluster_client(cluster.url)
        lost = int(client.get_default_node().port)
        assert lost == client.nodes_manager.slots_cache[0][0].port

        def port(key: str) -> int:
            return int(client.get_node_from_key(key).port)

        # a prefix whose drainer keys are on that master, and none of the run lists
        ks = next(k for k in (Keyspace(f"{key_prefix}{i}") for i in range(5000))
                  if port(k.outbox_errors) == port(k.outbox_dead_runs) == lost
                  and lost not in {port(k.active_runs), port(k.storing_runs)})  # fmt: skip
        rid = next(r for r in (uuid.uuid4().hex[:12] for _ in range(1000))
                   if port(ks.run(r)) != lost)  # fmt: skip
        state = RunState(cast(redis.Redis, client), _settings(cluster.url, ks.prefix))
        entry = _storing_run(client, state, ks, rid, 1)
        client.xadd(ks.run_outbox(rid), {**entry, "items": b"[{"})  # type: ignore[dict-item]
        assert state.status(rid) == "storing"
        nodes = _kill_master(cluster, lost)
        wait_for(lambda: lost_ranges(client, fresh=True), 60, "the range seen lost")
        d = ClusterDrainer(client, ks.prefix, [JsonlSink(tmp_path / "items", fsync=False)],
                           hooks=[], runs_hooks=[], consumer="c")  # fmt: skip
        assert d.drain_once() == 2  # one stored, one dead-lettered (malformed: no items)
        assert state.counters(rid)["stored"] == 1 and state.status(rid) == "done"
        assert client.xlen(ks.run_outbox_dead(rid)) == 1
        assert d._unnoted == {rid}
        for n in nodes:
            n.start()
        cluster.wait_ok(60)
        wait_for(lambda: not lost_ranges(client, fresh=True), 60, "the range served again")
        client.xadd(ks.run_outbox(rid), {**entry, "items": b'[{"k": 2}]'})  # type: ignore[dict-item]
        d._next_refresh = 0.0
        assert d.drain_once() == 1
        assert client.smembers(ks.outbox_dead_runs) == {rid.encode()} and not d._unnoted


def test_a_lost_range_holds_back_only_its_runs_entries_in_a_drainers_batch(
    tmp_path, key_prefix, caplog: pytest.LogCaptureFixture
) -> None:
    """A drainer holding entries of two runs when one's range is lost: the other run's are
    stored and acknowledged at once, the lost run's held back (pending in their stream) with
    one line naming the slots, and stored once the range is served again, with one line (a
    cluster pipeline with one command for the lost range failed the whole batch, every run's
    items unstored for the loss's length)."""
    with RedisClusterServer(tmp_path / "cluster", node_timeout_ms=1000,
                            full_coverage=False) as cluster:  # fmt: skip
        client = cluster_client(cluster.url)
        slot0 = int(client.get_default_node().port)

        def port(key: str) -> int:
            return int(client.get_node_from_key(key).port)

        # a master that holds neither the runless stream (one slot whatever the prefix) nor,
        # if it can be helped, slot 0
        norun = port(Keyspace(key_prefix).run_outbox(""))
        lost = sorted((int(n.port) for n in client.get_primaries() if int(n.port) != norun),
                      key=lambda p: p == slot0)[0]  # fmt: skip
        ks = next(k for k in (Keyspace(f"{key_prefix}{i}") for i in range(5000))
                  if lost not in {port(k.outbox_errors), port(k.outbox_dead_runs),
                                  port(k.active_runs), port(k.storing_runs)})  # fmt: skip
        rid_lost = next(r for r in (uuid.uuid4().hex[:12] for _ in range(1000))
                        if port(ks.run(r)) == lost)  # fmt: skip
        rid_ok = next(r for r in (uuid.uuid4().hex[:12] for _ in range(1000))
                      if port(ks.run(r)) != lost)  # fmt: skip
        state = RunState(cast(redis.Redis, client), _settings(cluster.url, ks.prefix))
        _storing_run(client, state, ks, rid_lost, 2)
        entry = _storing_run(client, state, ks, rid_ok, 2)
        d = ClusterDrainer(client, ks.prefix, [JsonlSink(tmp_path / "items", fsync=False)],
                           hooks=[], runs_hooks=[], consumer="c")  # fmt: skip
        buffer = d.read(100, None)
        assert {e.run for e in buffer} == {rid_lost, rid_ok}
        nodes = _kill_master(cluster, lost)
        wait_for(lambda: lost_ranges(client, fresh=True), 60, "the range seen lost")
        caplog.set_level("WARNING", logger="external_interface.storage.outbox")
        assert d.flush(buffer) == []  # nothing to retry: the lost run's entry is held back
        assert state.counters(rid_ok)["stored"] == 1
        assert [e.run for e in d.held.entries.values()] == [rid_lost]
        client.xadd(ks.run_outbox(rid_ok), {**entry, "items": b'[{"k": 2}]'})  # type: ignore[dict-item]
        d._next_refresh = 0.0
        assert d.drain_once() == 1  # the healthy run goes on
        assert state.counters(rid_ok)["stored"] == 2 and state.status(rid_ok) == "done"
        lines = [r.getMessage() for r in caplog.records if "outbox drainer" in r.getMessage()]
        assert len(lines) == 1 and "lost" in lines[0] and "1 entries" in lines[0], lines
        for n in nodes:
            n.start()
        cluster.wait_ok(60)
        wait_for(lambda: not lost_ranges(client, fresh=True), 60, "the range served again")
        d._next_refresh = 0.0
        assert d.drain_once() == 1  # the entry held back, given back by `read`
        assert state.counters(rid_lost)["stored"] == 1 and not d.held
        lines = [r.getMessage() for r in caplog.records if "outbox drainer" in r.getMessage()]
        assert len(lines) == 2 and "served again" in lines[1], lines
