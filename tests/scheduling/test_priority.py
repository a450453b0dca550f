"""Run priorities on both brokers: a more urgent run queued later is served first."""

from __future__ import annotations

import os
import time
import uuid

import pytest

import chains
from chains import Chain, step
from config import get_settings, reset_settings
from tests.scheduling.server import SchedSite

pytestmark = pytest.mark.integration

PER_RUN = 6


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest, sched_env: dict[str, str]) -> str:
    """The broker URL for this test's workers; the test process is pointed at it too."""
    if request.param == "redis":
        return ""
    url = request.getfixturevalue("amqp_broker")
    os.environ["CHAINCRAWL_BROKER_URL"] = url  # sched_env restores it afterwards
    reset_settings()
    import worker

    worker.configure(get_settings())
    return url


def test_urgent_run_overtakes_queued_runs(
    broker: str, start_workers, sched_site: SchedSite
) -> None:
    """Three runs queued low, mid, high (in that order) before any worker exists; one worker
    with one slot and prefetch 1 then serves them high, mid, low."""
    tag = uuid.uuid4().hex[:8]
    ping = Chain("prio", step("sched.local.ping"))
    runs = {}
    for name, prio in (("low", 1), ("mid", 5), ("high", 9)):
        seeds = [{"tag": f"{tag}-{name}", "n": i} for i in range(PER_RUN)]
        runs[name] = chains.run(ping, seeds, priority=prio)
    time.sleep(0.2)  # let the broker settle the messages before anyone consumes
    start_workers(
        1, concurrency=1, CHAINCRAWL_BROKER_URL=broker, CHAINCRAWL_PREFETCH_MULTIPLIER="1"
    )
    deadline = time.monotonic() + 30
    while not all(r.progress().status == "done" for r in runs.values()):
        assert time.monotonic() < deadline, {n: r.progress().totals for n, r in runs.items()}
        time.sleep(0.1)
    hits = sorted((h for h in sched_site.hits if h.tag.startswith(tag)), key=lambda h: h.t)
    order = [h.tag.rsplit("-", 1)[1] for h in hits]
    print(f"\n{broker.split('@')[-1] or 'redis'}: served {' '.join(order)}")
    assert order == ["high"] * PER_RUN + ["mid"] * PER_RUN + ["low"] * PER_RUN
    # within one priority the queue stays first in, first out
    assert [h.n for h in hits[:PER_RUN]] == list(range(PER_RUN))
