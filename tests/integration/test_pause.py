"""Pausing a run (`chains.pause`/`resume`, `RunHandle.pause`, `control.sh pause|resume`): real
workers stop fetching its pages within about a second and park what comes up in Redis, other
runs go on, and after resume the run completes with every page fetched exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import chains
from config import ROOT, get_settings, reset_settings
from exceptions import UnknownChainError
from monitor import status as st
from tests.testsite import chains as tchains
from utils import environ
from utils.redis import get_redis

pytestmark = pytest.mark.integration

PAGES = 80  # 0.3 s each, 4 page slots: 6 s if never paused


def _hits(test_site: Any, key: str) -> list[int]:
    return [test_site.hits[f"flaky:e1-{i}-{key}"] for i in range(PAGES)]


def _cli(cc_env: dict[str, str], *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT,
                         env={**cc_env, **os.environ}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _until(cond: Any, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest, cc_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The workers' broker; this process (and the CLI it runs) is pointed at it too."""
    if request.param == "redis":
        yield {}
        return
    import worker

    url = request.getfixturevalue("amqp_broker")
    saved = environ.apply({"CHAINCRAWL_BROKER_URL": url})
    reset_settings()
    worker.configure(get_settings())
    try:
        yield {"CHAINCRAWL_BROKER_URL": url}
    finally:
        environ.restore(saved)
        reset_settings()
        worker.configure(get_settings())


def probe_metrics() -> dict[str, Any]:
    """The probe task's counters as `control.sh status` and the exporter show them."""
    return st.summary(st.task_metrics(get_redis(), get_settings()).get("testsite.local.probe", {}))


def test_a_paused_run_waits_in_redis_and_resumes_to_an_exact_finish(
    broker: dict[str, str], start_worker, test_site: Any, cc_env: dict[str, str]
) -> None:
    start_worker(concurrency=4, name="pause", CHAINCRAWL_VISIBILITY_TIMEOUT="120", **broker)
    key = f"pause{int(time.time() * 1000)}"
    before = probe_metrics()
    run = chains.run(
        tchains.probe(f"/flaky/{{entry_id}}-{key}?fails=0&delay=0.3"), seeds=[{"per": PAGES}]
    )
    _until(lambda: sum(_hits(test_site, key)) >= 8, "8 pages fetched")
    # every active run of the chain, as for a site under maintenance
    out = _cli(cc_env, "pause", "--chain", "testsite_probe", "--reason", "test")
    assert f"run {run.run_id} paused" in out, out
    at_pause = sum(_hits(test_site, key))

    # every task of the run still in the broker comes up and is parked, without a request
    _until(lambda: (p := run.progress()).waiting == p.outstanding, "all parked")
    p = run.progress()
    assert p.status == "paused" and not p.ended, p.as_dict()
    held = sum(_hits(test_site, key))
    # the pages being fetched finish; a batch's pages waiting for a slot notice within a
    # second (4 slots of 0.3 s pages: at most about 13 more)
    assert held - at_pause <= 16, (at_pause, held)
    assert p.outstanding == PAGES - held > 0, p.as_dict()
    other = chains.run(tchains.probe(f"/flaky/{{entry_id}}-{key}x?fails=0"), seeds=[{"per": 5}])
    q = other.wait(timeout=30)  # the workers serve other runs meanwhile
    assert q.complete and q.steps["local.probe"]["succeeded"] == 5, q.totals
    time.sleep(1.0)
    assert sum(_hits(test_site, key)) == held, "nothing fetched while paused"
    listed = json.loads(_cli(cc_env, "runs", "--json"))  # newest first, finished ones too
    assert [(r["run_id"], r["status"], r["reason"]) for r in listed[:2]] == [
        (other.run_id, "done", ""), (run.run_id, "paused", "test")
    ]  # fmt: skip

    out = _cli(cc_env, "resume", "--all")
    assert f"run {run.run_id} resumed: {PAGES - held} waiting task(s) sent" in out, out
    p = run.wait(timeout=60)
    assert p.complete and p.status == "done", p.as_dict()
    probe = p.steps["local.probe"]
    assert probe["dispatched"] == probe["succeeded"] == PAGES, probe
    assert probe["cancelled"] == 0 and p.totals["failed"] == 0, p.totals
    assert _hits(test_site, key) == [1] * PAGES  # each page fetched once: parked ones too
    # one item per page from the listing's entries and one per probe: none lost, none twice
    assert p.totals["stored"] == p.totals["items"] == 2 * PAGES == 16 * q.totals["items"]

    # the task metrics (Prometheus' view) account for every attempt: the parked ones end as
    # `paused`, so started = succeeded + paused once the workers flush (each second); the
    # counters are the test session's, so this test's share is what they grew by
    def grown() -> dict[str, int]:
        now = probe_metrics()
        return {k: now[k] - before[k] for k in ("started", "succeeded", "paused",
                                                            "duplicate")}  # fmt: skip

    _until(lambda: grown()["succeeded"] == PAGES + 5, "metrics flushed")  # + the other run's
    m = grown()
    assert (m["paused"], m["duplicate"]) == (PAGES - held, 0), m
    assert m["started"] == m["succeeded"] + m["paused"], m
    where = broker.get("CHAINCRAWL_BROKER_URL", "redis").split("@")[-1]
    print(f"\n{where}: paused after {at_pause} pages, {held - at_pause} more finished; "
          f"{PAGES - held} parked and resumed")  # fmt: skip

    shown = json.loads(_cli(cc_env, "runs", run.run_id, "--json"))
    assert shown["status"] == "done" and shown["steps"]["local.probe"]["succeeded"] == PAGES
    assert chains.pause(run.run_id).was == "done"  # an ended run is left alone
    assert "nothing to resume" in _cli(cc_env, "resume", run.run_id)
    with pytest.raises(UnknownChainError, match="no run 'nope'"):
        chains.resume("nope")
    bad = subprocess.run([sys.executable, "-m", "cli", "pause"], cwd=ROOT, capture_output=True,
                         text=True, env={**cc_env, **os.environ}, timeout=60)  # fmt: skip
    assert bad.returncode != 0 and "give one of RUN_ID, --chain NAME or --all" in bad.stderr


def test_a_task_parked_between_its_retries_keeps_its_retry_count(
    start_worker, test_site: Any, cc_env: dict[str, str]
) -> None:
    """Every page fails for good (2 retries allowed). The run is paused while the pages wait
    out their second backoff, so they are parked and come back as new messages after resume:
    they carry their retry number (`meta.rbase`) and are dead-lettered after 3 requests in
    all, not handed 3 more (measured without it: 5 requests per page)."""
    start_worker(concurrency=4, name="pause-retry", CHAINCRAWL_MAX_RETRIES="2",
                 CHAINCRAWL_RETRY_BACKOFF="2")  # fmt: skip
    key = f"pretry{int(time.time() * 1000)}"
    n = 6
    run = chains.run(tchains.probe(f"/flaky/{{entry_id}}-{key}?fails=99"), seeds=[{"per": n}])
    hits = lambda: [test_site.hits[f"flaky:e1-{i}-{key}"] for i in range(n)]  # noqa: E731
    _until(lambda: min(hits()) >= 2, "every page failed twice")
    run.pause()
    _until(lambda: (p := run.progress()).waiting == p.outstanding, "all parked")
    assert run.progress().waiting == n and hits() == [2] * n, hits()
    assert run.resume().released == n
    p = run.wait(timeout=60)
    probe = p.steps["local.probe"]
    assert (probe["failed"], probe["retried"]) == (n, 2 * n), probe
    assert hits() == [3] * n
