"""The torture suite's store check sees what it must catch in the JSONL store's layout: an
entry written twice, a key stored by two entries, an item missing; its state-store readers
see every master of a Redis Cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from external_interface.storage.sinks.base import Origin
from external_interface.storage.sinks.jsonl import JsonlSink
from tests.torture.harness import check_store, counters, redelivered, scan_values
from utils.keyspace import Keyspace
from utils.redis import cluster_client

T = "torture.item"


def test_check_store_counts_rewrites_duplicate_keys_and_missing_items(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, fsync=False, mode="append")  # as the torture workers run it
    a, b = Origin("100-0", "r1", "s", "t"), Origin("200-0", "r1", "s", "t")
    sink.write(T, ["k"], [{"k": "a"}, {"k": "b"}], origins=[a, a])
    expected = {T: ("k", {"a", "b", "c"})}
    clean = check_store(tmp_path, expected, "r1")
    assert (clean.missing, clean.duplicates, clean.items_checked) == (1, 0, 2)

    sink.write(T, ["k"], [{"k": "a"}, {"k": "b"}], origins=[a, a])  # skipped: committed
    assert check_store(tmp_path, expected, "r1").rewrites == 0
    sink._store(T).done.clear()  # a sink that forgot it: the entry is written a second time
    sink.write(T, ["k"], [{"k": "a"}, {"k": "b"}], origins=[a, a])
    sink.write(T, ["k"], [{"k": "c"}], origins=[b])
    twice = check_store(tmp_path, expected, "r1")
    assert (twice.rewrites, twice.dup_keys, twice.missing) == (2, 0, 0)
    sink.write(T, ["k"], [{"k": "c"}], origins=[Origin("300-0", "r1", "s", "t")])
    assert check_store(tmp_path, expected, "r1").dup_keys == 1  # c stored by two entries
    assert check_store(tmp_path, expected, "another run").summary()["raw_records"] == 0


@pytest.mark.integration
def test_state_readers_see_every_master_of_a_cluster(redis_cluster, key_prefix) -> None:
    """The cluster variant of the SIGKILL torture reads its figures from the state store on a
    Redis Cluster: a SCAN must cover every master, not the one node a plain client talks to."""
    r = cluster_client(redis_cluster.url)
    tasks = [f"demo.t{i}" for i in range(30)]
    for n, task in enumerate(tasks, 1):
        r.hset(f"{key_prefix}:metrics:task:{task}", "redelivered", n)
    owners = {r.get_node_from_key(f"{key_prefix}:metrics:task:{t}").name for t in tasks}
    assert len(owners) == 3  # the keys spread over the masters
    assert redelivered(r, key_prefix, settle=0) == sum(range(1, 31))
    found = dict(scan_values(r, f"{key_prefix}:metrics:*"))
    assert len(found) == 30 and found[f"{key_prefix}:metrics:task:demo.t0"] == b"redelivered=1"
    r.hset(Keyspace(key_prefix).counters("r1"), mapping={"items": 3, "stored": 3})
    assert counters(r, key_prefix, "r1") == {"items": 3, "stored": 3}
