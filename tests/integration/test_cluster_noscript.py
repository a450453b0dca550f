"""A script a node lost (a restarted or flushed master) is cached again on that node alone:
the commit, `eval_scripts` and the dedup store run it there by EVAL, with no SCRIPT LOAD on the
other masters (a round trip each, and an error while any of them is down)."""

from __future__ import annotations

import uuid
from typing import Any, cast

import pytest
import redis

from config import Settings
from external_interface.dedup import MemoryDedup, RedisDedup
from ledger.state import RunState
from utils.redis import cluster_client, eval_scripts

pytestmark = pytest.mark.integration


def _script_calls(node: redis.Redis) -> int:
    """SCRIPT commands the node ran since its last CONFIG RESETSTAT (one stat on Redis 6,
    one a subcommand on Redis 7)."""
    stats = node.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_script"))


def _reset(masters: list[redis.Redis]) -> None:
    for m in masters:
        m.config_resetstat()


def test_a_commit_after_noscript_reloads_its_script_on_the_runs_master_alone(
    redis_cluster, key_prefix
) -> None:
    client = cluster_client(redis_cluster.url)
    settings = Settings(redis_url=redis_cluster.url, broker_url="redis://127.0.0.1:1/0",
                        key_prefix=key_prefix)  # fmt: skip
    state = RunState(cast(redis.Redis, client), settings)
    rid = uuid.uuid4().hex[:12]
    state.create_run(rid, "c", b"{}", 5)
    state.add_dispatched(rid, "s", 2)
    home = client.get_node_from_key(state.run_key(rid))
    masters = [n.client() for n in redis_cluster.masters()]
    for m in masters:
        m.script_flush()  # no master holds the commit script: every commit meets NOSCRIPT
    _reset(masters)
    got = state.commit(rid=rid, tid="a", step="s", outcome="succeeded", n_items=0, entries=())
    assert got is not None and got.outstanding == 1
    assert [_script_calls(m) for m in masters] == [0, 0, 0]  # no SCRIPT LOAD anywhere
    # the next commit is a plain EVALSHA on the run's master
    again = state.commit(rid=rid, tid="b", step="s", outcome="succeeded", n_items=0, entries=())
    assert again is not None and again.outstanding == 0
    assert [_script_calls(m) for m in masters] == [0, 0, 0]
    by_port = {int(m.connection_pool.connection_kwargs["port"]): m for m in masters}
    stats = by_port[int(home.port)].info("commandstats")
    assert stats["cmdstat_eval"]["calls"] == 1 and stats["cmdstat_evalsha"]["calls"] == 2
    sha = state._commit.sha
    assert by_port[int(home.port)].script_exists(sha) == [True]  # cached where it ran
    others = [m for p, m in by_port.items() if p != int(home.port)]
    assert [m.script_exists(sha) for m in others] == [[False], [False]]


def test_eval_scripts_after_noscript_reloads_on_the_node_that_answered_it(
    redis_cluster, key_prefix
) -> None:
    client = cluster_client(redis_cluster.url)
    script = client.register_script("return {KEYS[1], ARGV[1]}")
    masters = [n.client() for n in redis_cluster.masters()]
    keys = [f"{key_prefix}:{{s{i}}}:k" for i in range(12)]
    port_of = {k: int(client.get_node_from_key(k).port) for k in keys}
    a = keys[0]
    b = next(k for k in keys if port_of[k] != port_of[a])  # a key on another master
    client.script_load(script.script)  # every master holds it, as on a running deployment
    lost = next(m for m in masters if m.connection_pool.connection_kwargs["port"] == port_of[a])
    lost.script_flush()  # a's master restarted
    _reset(masters)
    calls: list[tuple[Any, list[str], list[str]]] = [(script, [a], ["1"]), (script, [b], ["2"])]
    assert eval_scripts(cast(redis.Redis, client), calls) == [
        [a.encode(), b"1"],
        [b.encode(), b"2"],
    ]
    assert [_script_calls(m) for m in masters] == [0, 0, 0]
    assert lost.script_exists(script.sha) == [True]
    lost.script_flush()  # one call alone (no pipeline) likewise
    _reset(masters)
    assert eval_scripts(cast(redis.Redis, client), calls[:1]) == [[a.encode(), b"1"]]
    assert [_script_calls(m) for m in masters] == [0, 0, 0]
    assert lost.script_exists(script.sha) == [True]


def test_a_registered_script_after_noscript_reloads_on_its_keys_node_alone(
    redis_cluster, key_prefix
) -> None:
    """Every script a cluster client registers (the run's cancel, pause, park..., the leases)."""
    client = cluster_client(redis_cluster.url)
    script = client.register_script("return {KEYS[1], ARGV[1]}")
    masters = [n.client() for n in redis_cluster.masters()]
    key = f"{key_prefix}:{{r1}}:k"
    port = int(client.get_node_from_key(key).port)
    home = next(m for m in masters if m.connection_pool.connection_kwargs["port"] == port)
    client.script_load(script.script)
    home.script_flush()
    _reset(masters)
    assert script(keys=[key], args=["x"]) == [key.encode(), b"x"]
    assert script(keys=[key], args=["y"]) == [key.encode(), b"y"]  # EVALSHA again, cached
    assert [_script_calls(m) for m in masters] == [0, 0, 0]
    stats = home.info("commandstats")
    assert stats["cmdstat_eval"]["calls"] == 1 and stats["cmdstat_evalsha"]["calls"] == 2
    assert home.script_exists(script.sha) == [True]
    plain = masters[0].register_script("return ARGV[1]")  # one Redis: redis-py's own Script
    assert plain(args=["z"]) == b"z"


def test_the_dedup_store_after_noscript_reloads_on_each_master_that_lost_it_alone(
    redis_cluster, key_prefix
) -> None:
    client = cluster_client(redis_cluster.url)
    store = RedisDedup("noscript", cast(redis.Redis, client), prefix=key_prefix, capacity=100_000)
    twin = MemoryDedup()
    ids = [f"item-{i}" for i in range(3000)]
    assert store.mark_many(ids[:1500]) == twin.mark_many(ids[:1500])  # the script on every master
    masters = [n.client() for n in redis_cluster.masters()]
    port_of = {int(m.connection_pool.connection_kwargs["port"]): m for m in masters}
    sha = store._script.sha
    lost = masters[0]
    lost.script_flush()  # one master restarted: many of a batch's calls meet NOSCRIPT there
    _reset(masters)
    assert store.mark_many(ids) == twin.mark_many(ids)  # half seen, half new
    assert [_script_calls(m) for m in masters] == [0, 0, 0]  # no SCRIPT LOAD anywhere
    evals = [int(m.info("commandstats").get("cmdstat_eval", {}).get("calls", 0)) for m in masters]
    assert evals == [1, 0, 0]  # one call ran by EVAL on the master that lost it, the rest EVALSHA
    assert lost.script_exists(sha) == [True]
    for m in masters:
        m.script_flush()  # every master lost it: one EVAL on each
    _reset(masters)
    probe = [f"item-{i}" for i in range(2000, 4000)]
    assert store.check_many(probe) == twin.check_many(probe)
    assert [_script_calls(m) for m in masters] == [0, 0, 0]
    stats = [m.info("commandstats") for m in masters]
    assert [int(st["cmdstat_eval"]["calls"]) for st in stats] == [1, 1, 1]
    assert all(int(st["cmdstat_evalsha"]["calls"]) > 1 for st in stats)
    assert [m.script_exists(sha) for m in port_of.values()] == [[True]] * 3
    store.clear()
