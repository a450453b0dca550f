"""A page that waits (a lease not free) or is retried gives its metrics to the process's sums,
as a commit does, instead of writing every field with HINCRBYs in its own round trip: such a
page comes back many times, and those writes were most of a page's commands in a crawl short
of sessions (`bench.redis_cost --features`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
import redis

from config import reset_settings
from exceptions import FetchError, ResourceUnavailable
from lifecycle import page, runtime
from monitor.metrics import TaskMetrics
from utils import environ
from utils.redis import reset_clients
from utils.wire import TaskMeta


class Retried(Exception):
    """What the fake task's `retry_later` returns (Celery's Retry in a worker)."""


class FakeTask:
    name = "waits.pc.page"
    spec = SimpleNamespace(name=name, site="waits", max_retries=None)
    request = SimpleNamespace(id="tid-1", retries=0)

    def retry_later(
        self, params: Any, meta: TaskMeta, countdown: float, exc: Exception
    ) -> Exception:
        return Retried(countdown)


@pytest.fixture
def settings_on(redis_url: str, key_prefix: str) -> Iterator[None]:
    saved = environ.apply({"CHAINCRAWL_REDIS_URL": redis_url, "CHAINCRAWL_KEY_PREFIX": key_prefix})
    reset_settings()
    reset_clients()
    try:
        yield
    finally:
        environ.restore(saved)
        reset_settings()
        reset_clients()


def test_a_waiting_page_hands_its_metrics_to_the_process_sums(
    settings_on: None, rds: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[dict[str, int]] = []
    monkeypatch.setattr(page, "aggregate", lambda rt, m, spec: handed.append(dict(m.counts)))
    state = runtime.current().state()
    deliveries = state.deliveries_key("", "tid-1", 0)
    rds.set(deliveries, 1)
    metrics = TaskMetrics()
    metrics.outcome("started")
    mon = rds.monitor()
    with mon:
        with pytest.raises(Retried):
            page.fail_page(
                cast("page.PageTask", FakeTask()),
                ResourceUnavailable("no cookie free", retry_after=1.0),
                {},
                TaskMeta(),
                None,
                state,
                metrics,
                time.monotonic(),
                forget=(deliveries,),
            )
        rds.echo("the end")
        sent = []
        while (cmd := str(mon.next_command()["command"])) != "ECHO the end":
            sent.append(cmd.split(" ")[0])
    # the next attempt counts its own deliveries; no HINCRBY (the client's handshake aside)
    assert [c for c in sent if c not in ("HELLO", "PING", "CLIENT")] == ["UNLINK"]
    assert not rds.exists(deliveries)
    assert len(handed) == 1 and handed[0]["waited:ResourceUnavailable"] == 1
    assert handed[0]["started"] == 1 and handed[0]["latency_count"] == 1


class Published:
    """The app a committed page sends its released children with (none here)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []


def test_a_page_of_a_run_cancelled_meanwhile_is_committed_cancelled_not_retried(
    settings_on: None, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page failing with a retryable error after its run was cancelled: no retry with a
    countdown (the run stayed `cancelling` until it came up, up to RETRY_BACKOFF_MAX later);
    committed `cancelled`, which ends the run."""
    monkeypatch.setattr(page, "aggregate", lambda rt, m, spec: None)
    rt = runtime.current()
    state = rt.state()
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 1)
    state.cancel("r1")
    assert state.status("r1") == "cancelling"
    task = FakeTask()
    task.app = Published()  # type: ignore[attr-defined]
    metrics = TaskMetrics()
    metrics.outcome("started")
    for exc in (FetchError("connection reset"), ResourceUnavailable("no cookie", retry_after=1.0)):
        out = page.fail_page(
            cast("page.PageTask", task),
            exc,
            {},
            TaskMeta(run_id="r1", step="s"),
            None,
            state,
            metrics,
            time.monotonic(),
        )
        assert out == "cancelled"
    assert state.status("r1") == "cancelled"
    assert state.counters("r1")["cancelled"] == 1  # the second commit of the task: a duplicate


def test_a_cancel_look_that_meets_no_redis_leaves_the_retry_as_it_was(
    settings_on: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(page, "aggregate", lambda rt, m, spec: None)
    rt = runtime.current()

    def down(state: Any, rid: str) -> str:
        raise redis.ConnectionError("Redis does not answer")

    monkeypatch.setattr(rt, "hold", down)
    with pytest.raises(Retried):
        page.fail_page(
            cast("page.PageTask", FakeTask()),
            FetchError("connection reset"),
            {},
            TaskMeta(run_id="r1", step="s"),
            None,
            rt.state(),
            TaskMetrics(),
            time.monotonic(),
        )
