"""A task whose worker dies every time it runs it: capped, dead-lettered as PoisonMessage.

`torture.local.die` takes its process down (`os._exit(3)`, or SIGKILL of itself) after
hitting `/hit/{token}` on the bad-pages server, so the test counts the deliveries that ran.
Every redelivery of an attempt (the broker flags it `redelivered`) is counted in Redis before
the endpoint runs (`deliv:{task id}:{retries}`); the one past `CHAINCRAWL_MAX_REDELIVERIES` (2 here) is
dead-lettered as PoisonMessage without running the endpoint. So the task runs exactly
1 + 2 times, the run completes with it failed, and it is never delivered again.

- threads pool: the whole worker dies each time; a supervisor (as systemd or control.sh would)
  starts another; the message comes back after the visibility timeout (8 s) on Redis, at
  once on RabbitMQ (where only the cap stops the loop).
- prefork pool: only the pool child dies; the worker lives, Celery sees WorkerLostError and
  (reject_on_worker_lost) requeues the message at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kombu.transport import pyamqp

import chains
from chains import Chain, step
from monitor.deadletter import DeadLetterStore
from tests.torture.badsite import BadSite
from tests.torture.conftest import broker_env, report
from tests.torture.harness import wait_complete
from utils.redis import get_redis

pytestmark = pytest.mark.timeout(300)
SLOW = pytest.mark.slow  # the long run covers every combination, CI two of them

CAP = 2  # CHAINCRAWL_MAX_REDELIVERIES


@pytest.fixture
def site() -> Iterator[BadSite]:
    s = BadSite().start()
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize(
    "pool, how, broker",
    [
        pytest.param("threads", "exit", "redis", marks=pytest.mark.integration),
        pytest.param("threads", "kill", "redis", marks=SLOW),
        pytest.param("prefork", "exit", "redis", marks=SLOW),
        pytest.param("prefork", "kill", "redis", marks=pytest.mark.integration),
        # RabbitMQ requeues a dead consumer's messages at once: without the cap, a loop
        pytest.param("threads", "kill", "amqp", marks=pytest.mark.integration),
        pytest.param("prefork", "kill", "amqp", marks=SLOW),
    ],
)
def test_task_that_kills_its_worker_is_dead_lettered_as_poison(
    pool: str, how: str, broker: str, site: BadSite, torture_factory: Any, fleets: Any,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    t = torture_factory(
        TORTURE_SITE_URL=site.url, CHAINCRAWL_MAX_REDELIVERIES=str(CAP),
        **broker_env(broker, request),
    )  # fmt: skip
    fleet = fleets(t, queues="torture", pool=pool, concurrency=2)
    (first,) = fleet.start(1)
    fleet.supervise(1)
    token = f"{pool}-{how}"
    handle = chains.run(
        Chain("torture_die", step("torture.local.die")), seeds=[{"how": how, "token": token}]
    )
    p = wait_complete(handle, timeout=150)
    hits = site.hits[f"/hit/{token}"]

    dls = [d for d in DeadLetterStore(get_redis()).list(100) if d.meta.get("run") == handle.run_id]
    report(request.node.name, runs_of_the_task=hits, worker_deaths=len(fleet.deaths),
           dead_letter=dls[0].error if dls else None)  # fmt: skip
    assert p.complete and p.totals["failed"] == 1 and p.totals["succeeded"] == 0
    assert len(dls) == 1
    assert dls[0].error_type == "PoisonMessage"
    assert f"delivered {CAP + 2} times" in dls[0].error and f"cap {CAP}" in dls[0].error
    assert hits == CAP + 1  # the endpoint ran 1 + CAP times, the last delivery did not run it
    if pool == "threads":
        assert len(fleet.deaths) == CAP + 1
    else:
        assert fleet.deaths == [] and first.alive()  # only pool children died
        assert "WorkerLostError" in first.text()
    # never delivered again: past a visibility timeout and a restore sweep, nothing more
    time.sleep(12)
    assert site.hits[f"/hit/{token}"] == hits
    assert _messages_left(t.prefix, broker) == 0


def _messages_left(prefix: str, broker: str) -> int:
    """Messages of the torture queue still in the broker: on Redis ready or unacked, on
    RabbitMQ ready (a delivery to the live worker would show as a hit on the site)."""
    if broker == "redis":
        r = get_redis()
        ready = sum(r.llen(k) for k in r.scan_iter(f"{prefix}:q:torture*"))
        return ready + r.hlen(f"{prefix}:q:unacked")
    from worker import app

    with app.connection_for_write() as conn:  # passive: the count of ready messages
        channel = cast(pyamqp.Channel, conn.default_channel)
        declared = channel.queue_declare("torture", passive=True)
        assert declared is not None  # passive, not nowait: the broker answers
        _name, count, _consumers = declared
    return int(count)


@pytest.mark.integration
def test_poison_entry_of_a_batch_is_dead_lettered_alone(
    site: BadSite, torture_factory: Any, fleets: Any, request: pytest.FixtureRequest
) -> None:
    """Seven pages in one `chaincrawl.batch` message, the fourth killing its worker. The first
    delivery runs the three before it (their commits wait for the batch's end, so they are lost
    with the worker); the redelivered batch runs entry by entry, committing each at once and
    counting a delivery only for the entry it starts. So the pages before the poison run twice,
    the ones after it once, and only the poison one is charged: it runs 1 + CAP times and is
    dead-lettered alone."""
    t = torture_factory(
        TORTURE_SITE_URL=site.url, CHAINCRAWL_MAX_REDELIVERIES=str(CAP),
        CHAINCRAWL_BATCH="20", CHAINCRAWL_BATCH_BACKLOG="1",
    )  # fmt: skip
    fleet = fleets(t, queues="torture", pool="threads", concurrency=2)
    fleet.start(1)
    fleet.supervise(1)
    good = [f"ok-{i}" for i in range(6)]
    ch = Chain(
        "torture_batch_die",
        step("torture.local.emit").then(step("torture.local.maybe_die", token="value")),
    )
    handle = chains.run(ch, seeds=[{"values": [*good[:3], "die-batch", *good[3:]]}])
    p = wait_complete(handle, timeout=150)
    hits = {tok: site.hits[f"/hit/{tok}"] for tok in [*good, "die-batch"]}
    dls = [d for d in DeadLetterStore(get_redis()).list(100) if d.meta.get("run") == handle.run_id]
    report(request.node.name, hits=hits, worker_deaths=len(fleet.deaths),
           dead_letters=[d.error for d in dls])  # fmt: skip
    assert p.complete
    s = p.steps["local.maybe_die"]
    assert s["dispatched"] == 7 and s["succeeded"] == 6 and s["failed"] == 1
    assert s["items"] == 6
    assert len(dls) == 1 and dls[0].error_type == "PoisonMessage"
    assert dls[0].params == {"token": "die-batch"}
    assert f"delivered {CAP + 2} times" in dls[0].error
    assert hits["die-batch"] == CAP + 1
    assert [hits[t] for t in good] == [2, 2, 2, 1, 1, 1]
    assert len(fleet.deaths) == CAP + 1
