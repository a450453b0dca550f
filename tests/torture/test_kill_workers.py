"""Workers SIGKILLed at random moments through a demo crawl: every item stored exactly once.

Two or more threads-pool workers crawl the demo platform (`demo_social`: h5 feed -> users and
statuses -> app details -> pc comments). A killer thread SIGKILLs a random worker (its whole
process group) every 2-5 s and starts a replacement, until the run is complete. Nothing runs
on the victim's way out: tasks in flight are neither finished nor acknowledged, the outbox
drainer's batch is neither written nor acknowledged, a JSONL write may be torn.

Recovery comes from the mechanism alone: on Redis the sweeper gives a dead worker's
unacknowledged messages back once its heartbeat is 3 s old (broker/owners.py), and
kombu does after the visibility timeout (8 s here) whatever is left; RabbitMQ gives them back
when the connection drops. The commit script runs once per task id, drainers claim
entries a dead drainer left pending after `CHAINCRAWL_OUTBOX_CLAIM_IDLE` (2 s), and the JSONL
sink skips entries it already committed.

Brokers (`broker`): "redis" and "amqp" keep the run state, outbox and items in the torture's
private Redis; "cluster" puts them on a Redis Cluster of the test's own (3 masters, a replica
each) with the private Redis as the broker: a run's ledger and outbox stream on one slot,
stored by the `ClusterDrainer`.

"Exactly once" is checked three ways:
- the run's counters: every page dispatched once and succeeded once, `stored == items` ==
  the site's users + posts + comments, nothing failed;
- the store (`read_items`, latest version per key): exactly the site's ids, none missing,
  none extra;
- the raw JSONL records: no key stored by two different outbox entries (a task committed
  twice) and no (key, entry) pair written twice (a redelivered entry written again).

Messages the broker loses (docs/reliability.md: popped by a worker killed before
kombu recorded them in `unacked`) are re-sent by chaincrawl's run-ledger sweeper
(chains/sweeper.py) once the run stalls for 3 s; the test re-sends nothing and reports the
sweeper's count (`resent`). A raw record written twice by one entry (the drainer writing an entry twice) is raised as
`BrokenGuarantee` after every other check.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest
import redis

import chains
from demo.testing import DemoServer
from monitor.status import dead_worker_restored
from tests.torture.conftest import broker_env, on_cluster, report, sizes
from tests.torture.harness import (
    Killer,
    check_store,
    demo_expected_ids,
    raise_broken_guarantees,
    redelivered,
    sweeper_resends,
    wait_complete,
)
from utils.keyspace import Keyspace
from utils.redis import get_redis, is_cluster


@dataclass
class Size:
    users: int  # demo_social crawls 12.05 pages and stores 31 items per user (P=5, C=5)
    workers: int
    timeout: float
    min_kills: int  # one kill per <= interval[1] s: the short crawl takes >= 8 s, the long >= 35 s
    latency_ms: int = 40
    # seconds between two kills (uniform); a killed worker's messages come back within ~5 s
    # on Redis (the sweeper restores a dead owner's messages) and at once on RabbitMQ, so a short crawl takes only 10-19 s
    interval: tuple[float, float] = (1.0, 2.5)
    amqp_interval: tuple[float, float] = (1.0, 2.5)  # on RabbitMQ


SHORT = Size(users=130, workers=2, timeout=420, min_kills=3)  # ~1,570 pages, 4,030 items
LONG = Size(users=830, workers=3, timeout=3000, min_kills=15, interval=(0.7, 2.0),
            amqp_interval=(0.5, 1.5))  # ~10,000 pages  # fmt: skip


def social_pages(exp: dict[str, Any]) -> int:
    return (
        exp["h5"]["feed_pages"] + exp["h5"]["profile_requests"] + exp["h5"]["status_pages"]
        + exp["app"]["detail_requests"] + exp["pc"]["comment_pages"]
    )  # fmt: skip


@pytest.mark.parametrize("broker", ["redis", "amqp", "cluster"])
@pytest.mark.parametrize("size", sizes(SHORT, LONG))
def test_random_sigkills_store_every_item_exactly_once(
    size: Size, broker: str, torture_factory: Any, fleets: Any, request: pytest.FixtureRequest
) -> None:
    if on_cluster(broker) and size is LONG:
        pytest.skip(
            "long on a cluster: at this kill rate on 2 cores a page whose batch lands on worker "
            "after worker that is killed while it runs is charged 4 deaths and dead-lettered "
            "as poison at the default cap of 3 (not yet run with this test's cap of 8); see "
            "docs/reliability.md"
        )
    # the poison cap is for a task that kills its worker itself (test_poison.py); here the
    # kills are random, and on a busy cluster a page's batch can land on worker after worker
    # that is killed while it runs: each death is charged, so the cap is set where random
    # kills at this rate do not reach it (with the default 3 a short cluster run under load
    # once dead-lettered one innocent page)
    extra = {**broker_env(broker, request), "CHAINCRAWL_MAX_REDELIVERIES": "8"}
    if broker == "amqp":
        size = dataclasses.replace(size, interval=size.amqp_interval)
    with DemoServer(
        users=size.users, posts_per_user=5, comments_per_post=5,
        latency_ms=size.latency_ms, latency_jitter_ms=size.latency_ms,
    ) as demo:  # fmt: skip
        t = torture_factory(DEMO_BASE_URL=demo.url, cluster=on_cluster(broker), **extra)
        fleet = fleets(t, queues="demo", concurrency=8)
        fleet.start(size.workers)
        exp = demo.expected()
        pages = social_pages(exp)
        items = exp["users"] + exp["posts"] + exp["comments"]

        run = chains.run("demo_social", seeds=[{}])
        killer = Killer(fleet, interval=size.interval, seed=size.users)
        killer.start()
        try:
            p = wait_complete(run, timeout=size.timeout, progress_log=t.logs / "progress.log")
        finally:
            killer.stop()

        store = check_store(t.items, demo_expected_ids(exp), run.run_id)
        again = redelivered(get_redis(), t.prefix)
        logs = fleet.logs().values()
        claimed = sum(text.count("claimed") for text in logs)
        resent = sweeper_resends(logs)
        figures = {
            "pages": pages,
            "kills_survived": killer.kills,
            "kills_of_busy_workers": killer.kills_busy,
            "redelivered_attempts": again,
            "drainer_claims_logged": claimed,
            "messages_lost_by_broker_resent_by_sweeper": p.totals["resent"],
            "restored_from_dead_workers": dead_worker_restored(get_redis()),
            "items_expected": items,
            **store.summary(),
            "counters": p.totals,
            "elapsed_s": round(p.elapsed, 1),
        }
        figures.pop("by_type")
        report(request.node.name, **figures)

        assert p.complete and p.outstanding == 0
        assert p.totals["failed"] == 0, p.totals
        assert p.totals["dispatched"] == p.totals["succeeded"] == pages, p.totals
        assert p.totals["stored"] == p.totals["items"] == items, p.totals
        assert store.missing == 0, store.summary()
        assert store.items_checked == items, store.summary()
        assert store.dup_keys == 0, store.summary()
        assert killer.kills >= size.min_kills, killer.timeline
        assert again > 0  # the kills really hit tasks in flight
        assert len(resent) == p.totals["resent"]  # every re-send logged by a sweeper
        if (
            broker == "amqp"
        ):  # losing a popped message is the Redis transport's: RabbitMQ loses nothing
            assert p.totals["resent"] == 0, resent
        if on_cluster(broker):  # the run's ledger lived on the cluster, not the broker's Redis
            assert is_cluster(get_redis())
            ks = Keyspace(t.prefix)
            assert get_redis().exists(ks.counters(run.run_id))
            assert not redis.Redis.from_url(t.redis.url).exists(ks.counters(run.run_id))
        raise_broken_guarantees(store=store)
