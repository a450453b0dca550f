"""bench.redis_cost: a small crawl with real workers and the broker apart reports a page's
calls, commands and CPU, and with the sink down the outbox's bytes an item; entries of a
batch are merged (more items than entries). The MONITOR count of a known set of commands,
by key family; the demo chain with every feature on (`--features`), and on a cluster with
WAIT each master's share and the crawl's pages/s."""

from __future__ import annotations

import json
import shutil
from typing import Any, cast

import pytest
import redis

from bench import redis_cost, redis_counts
from demo.config import DemoConfig
from tests.conditions import wait_for
from utils.keyspace import Keyspace
from utils.servers import RedisServer


@pytest.mark.integration
def test_a_small_crawl_reports_a_pages_cost_and_the_backlog(capsys) -> None:
    assert redis_cost.main(["--pages", "300", "--backlog"]) == 0
    text = capsys.readouterr().out
    crawl = json.loads(text.splitlines()[0])
    assert crawl["pages"] == crawl["stored"] > 250 and crawl["failed"] == 0
    out = json.loads(text[text.index("{\n") :])
    assert 0 < out["calls_per_page"] < out["commands_per_page"]
    assert out["calls_by_command_per_page"]["evalsha"] > 0  # the commit script, counted once
    assert out["commands_in_scripts_per_page"] > 0
    assert out["redis_process_us_per_page"] > 0 and out["broker_redis_us_per_page"] > 0
    assert out["cpu_share_per_master"] == [1.0] and crawl["busiest_master_vs_mean"] == 1.0
    assert out["busiest_master_vs_mean_per_crawl"] == [1.0]
    assert out["busiest_master_vs_mean_crawls_summed"] == 1.0
    backlog = out["outbox_backlog"]
    assert backlog["items_waiting"] == crawl["stored"]  # one item a page, none stored
    assert backlog["items_per_entry"] > 1  # a batch's entries of one step and type: one
    assert backlog["bytes_per_item"] > backlog["item_json_bytes"] > 0


@pytest.mark.integration
@pytest.mark.skipif(not shutil.which("valgrind") or not shutil.which("callgrind_control"),
                    reason="needs valgrind (callgrind)")  # fmt: skip
def test_callgrind_counts_the_state_stores_instructions_over_the_measured_crawl(capsys) -> None:
    assert redis_cost.main(["--pages", "200", "--no-calls", "--callgrind"]) == 0
    text = capsys.readouterr().out
    out = json.loads(text[text.index("{\n") :])
    # a page's commit, drain and bookkeeping: tens of thousands of instructions, not the
    # server's start-up (uninstrumented) nor a count per call
    assert 20_000 < out["redis_instructions_per_page"] < 1_000_000
    assert "redis_process_us_per_page" not in out  # meaningless under valgrind


def test_the_balance_is_each_crawls_own_beside_the_crawls_summed() -> None:
    """Three one-run crawls whose runs landed on different masters: each crawl's busiest master
    is its run's (2.7, 2.4 and 1.2 times the mean); their time summed per master reads 1.3,
    more even than two of the three crawls were."""
    usec = [[90, 5, 5], [10, 10, 80], [30, 30, 40]]
    spent: list[dict[str, Any]] = [{"usec": u, "calls": u, "cpu": u} for u in usec]
    assert redis_counts.balance(spent) == {
        "busiest_master_vs_mean_per_crawl": [2.7, 2.4, 1.2],
        "busiest_master_vs_mean_max_over_crawls": 2.7,
        "busiest_master_vs_mean_median_over_crawls": 2.4,
        "busiest_master_vs_mean_crawls_summed": 1.3,
    }
    summed_shares = [m["usec_share"] for m in redis_counts.per_master(spent, 100)]
    assert round(max(summed_shares) * 3, 2) == 1.3  # the per-master shares are the summed ones
    assert redis_counts.busiest_vs_mean([7]) == 1.0  # one Redis
    assert redis_counts.busiest_vs_mean([0, 0, 0]) == 0.0  # nothing ran
    two = redis_counts.balance(spent[:2])  # an even count: the median between the two
    assert two["busiest_master_vs_mean_median_over_crawls"] == 2.55


def test_the_monitor_counts_a_known_crawls_calls_commands_and_families(
    redis_server: RedisServer,
) -> None:
    """A known set of commands (a pipeline, a script with commands of its own, a plain call):
    the calls clients sent, the scripts' own commands, each by the family of its first key,
    and `INFO commandstats` agreeing on the total."""
    ks = Keyspace("rct")
    client = redis.Redis.from_url(redis_server.url)
    script = (
        "redis.call('HINCRBY', KEYS[1], 'a', 1); redis.call('HINCRBY', KEYS[1], 'b', 1);"
        " redis.call('ZADD', KEYS[2], 1, 'm'); return 1"
    )
    sha = client.script_load(script)  # and the connection's handshake, before MONITOR starts
    mon = redis_counts.Monitor(redis_server.url, ks)
    mon.start()
    assert mon.ready.wait(10)
    mon.counting = True
    before = redis_counts.commandstats([client])  # counted: its INFO is a command too
    pipe = client.pipeline(transaction=False)
    for field in ("started", "succeeded", "items"):
        pipe.hincrby("rct:metrics:task:t", field, 1)
    pipe.execute()
    client.evalsha(sha, 2, ks.counters("r1"), ks.pool("cookie", "demo") + ":free")
    client.set(ks.proxy_channel("demo") + ":x", 1)
    client.ping()
    wait_for(lambda: mon.top["ping"] == 1, 10, "the MONITOR lines")
    mon.counting = False
    mon.stop()
    after = redis_counts.commandstats([client])
    assert mon.top == {"info": 1, "hincrby": 3, "evalsha": 1, "set": 1, "ping": 1}
    assert mon.in_scripts == 3
    keyless = {"(info)": 1, "(ping)": 1}
    assert mon.call_families == {"metrics": 3, "run": 1, "proxy channel": 1, **keyless}
    assert mon.families == {"metrics": 3, "run": 3, "pool:cookie": 1, "proxy channel": 1, **keyless}
    assert mon.detail["run hincrby"] == 2 and mon.detail["run evalsha"] == 1
    ran = {k: c - before.get(k, (0, 0))[0] for k, (c, _) in after.items()}
    assert sum(ran.values()) == sum(mon.families.values()) == 10  # the second INFO not yet


@pytest.mark.parametrize(
    ("command", "key"),
    [
        ("HINCRBY k f 1", "k"),
        ("EVALSHA abc 2 k1 k2 a", "k1"),
        ("EVALSHA abc 0 a", None),
        ("XREADGROUP GROUP g c COUNT 10 BLOCK 5 STREAMS s1 >", "s1"),
        ("PING", None),
        ("SCRIPT LOAD x", None),
    ],
)
def test_first_key(command: str, key: str | None) -> None:
    assert redis_counts.first_key(command.split(" ")) == key


def test_an_evals_body_is_one_part_and_its_first_key_is_found() -> None:
    """`MONITOR` shows an EVAL's body with its spaces: the metrics flush's calls belong to the
    metrics family, not to whatever word of the body came third."""
    line = "EVAL local i = 1\\nreturn #KEYS 2 cc:metrics:task:t cc:metrics:site:s 1 ok 1 1 ok 1"
    parts = redis_counts.script_parts(line.split(" "), "cc")
    assert parts[:4] == ["EVAL", "local i = 1\\nreturn #KEYS", "2", "cc:metrics:task:t"]
    assert redis_counts.first_key(parts) == "cc:metrics:task:t"
    assert Keyspace("cc").family(redis_counts.first_key(parts) or "") == "metrics"
    keyless = ["EVAL", "return", "1", "0"]
    assert redis_counts.script_parts(keyless, "cc") == keyless


@pytest.mark.integration
def test_the_demo_chain_with_every_feature_on_counts_its_pages_and_where_commands_go(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--features` on the tiny demo site: every page of demo_social committed and stored
    through proxies, leases and production, and the MONITOR crawl's commands classified to
    the families that paid for them (every command counted once: families sum to calls plus
    the scripts' own)."""
    assert redis_cost.main(["--features", "--size", "tiny", "--workers", "2", "-c", "8"]) == 0
    text = capsys.readouterr().out
    crawl = json.loads(text.splitlines()[0])
    expected = cast("dict[str, Any]", DemoConfig(size="tiny").expected_counts())
    assert crawl["pages"] == expected["h5"]["requests"] and crawl["failed"] == 0
    assert crawl["stored"] == expected["users"] + expected["posts"] + expected["comments"]
    out = json.loads(text[text.index("{\n") :])
    families = out["commands_by_family_per_page"]
    for family in ("run", "outbox", "pool:cookie", "pool:device_id", "proxy channel"):
        assert families[family] > 0, family
    total = out["calls_per_page"] + out["commands_in_scripts_per_page"]
    assert sum(families.values()) == pytest.approx(total, abs=0.05)
    assert out["site_requests_per_page"] >= 1


@pytest.mark.integration
def test_the_every_feature_chain_on_a_cluster_with_wait_counts_each_master_and_its_pages_rate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--features --cluster --wait-replicas 1` on the tiny demo site: every page committed
    through a WAIT for its replica, each master's commands, commands' time and CPU summing to
    the whole and its shares to 1, and the pages/s the crawl's pages over its wall clock, with
    the CPU of the workers and of the machine beside it."""
    argv = ["--features", "--size", "tiny", "--workers", "2", "-c", "8", "--cluster"]
    assert redis_cost.main([*argv, "--wait-replicas", "1", "--no-calls", "--idle", "0"]) == 0
    text = capsys.readouterr().out
    crawl = json.loads(text.splitlines()[0])
    expected = cast("dict[str, Any]", DemoConfig(size="tiny").expected_counts())
    assert crawl["pages"] == expected["h5"]["requests"] and crawl["failed"] == 0
    out = json.loads(text[text.index("{\n") :])
    assert out["commands_by_command_per_page"]["wait"] > 0.3  # the workers' commits WAITed
    masters = out["per_master"]
    assert len(masters) == 3
    for field, whole in (
        ("commands_per_page", "commands_per_page"),
        ("usec_per_page", "redis_usec_per_page"),
        ("process_us_per_page", "redis_process_us_per_page"),
    ):
        assert sum(m[field] for m in masters) == pytest.approx(out[whole], rel=0.01), field
    for share in ("commands_share", "usec_share", "cpu_share"):
        assert sum(m[share] for m in masters) == pytest.approx(1, abs=0.005), share
    assert out["replicas_process_us_per_page"] > 0
    rate = out["throughput"]
    # the pages over the crawl's wall clock (printed to a tenth of a second: a tiny crawl's
    # takes well under one)
    assert out["pages"] / rate["pages_per_s"] == pytest.approx(out["crawl_seconds"], abs=0.051)
    assert rate["pages_per_s"] == pytest.approx(crawl["pages_per_s"], rel=0.01)
    per_page = rate["cpu_ms_per_page"]
    assert per_page["workers"] == pytest.approx(crawl["worker_cpu_ms_per_page"], rel=0.01)
    assert per_page["workers"] > 0 and per_page["site"] > 0
    assert per_page["state_masters"] == pytest.approx(
        out["redis_process_us_per_page"] / 1000, rel=0.01
    )
    # the machine's busy time holds every process of the crawl (and whatever else ran)
    assert per_page["machine"] >= 0.9 * (per_page["workers"] + per_page["state_masters"])


def test_wait_replicas_needs_the_cluster() -> None:
    with pytest.raises(SystemExit):
        redis_cost.main(["--features", "--wait-replicas", "1"])
