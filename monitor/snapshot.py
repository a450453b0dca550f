"""The whole picture `control.sh status` shows: processes, workers, queues, runs, dead letters,
the outbox, task and site metrics, pool health, re-crawls by change, the fleet budget's
shares, the modules that failed to import and firing alerts, in one
JSON-ready dict."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery

from broker.app import default_app
from config import Settings, get_settings
from monitor import alerts, health
from monitor.fleet import fleet_view
from monitor.status import (
    active_runs,
    adaptive,
    broken_modules,
    broker_client,
    dead_letters,
    dead_worker_restored,
    malformed,
    outbox,
    processes,
    queue_depths,
    recrawl_watches,
    site_metrics,
    site_of,
    summary,
    task_metrics,
    unacked,
    unknown_tasks,
    workers,
)
from utils.redis import get_redis
from utils.slots import SlotsLost, lost_ranges, reason


def snapshot(
    s: Settings | None = None,
    client: Any = None,
    *,
    workers_timeout: float | None = 1.0,
    runs_limit: int = 20,
    app: Celery | None = None,
) -> dict[str, Any]:
    """Everything `control.sh status` shows, JSON-ready. `workers_timeout=None` skips the
    broadcast to workers (which costs that many seconds); `app` sends it (default:
    `broker.app.default_app()`)."""
    s = s or get_settings()
    r = client if client is not None else get_redis(s.redis_url)
    ranges = lost_ranges(r)

    def part(fn: Callable[[], Any], default: Any = None) -> Any:
        """A section; with a slot range lost, one whose keys no node serves is left out."""
        if not ranges:
            return fn()
        try:
            return fn()
        except (SlotsLost, redis.RedisError, redis.exceptions.RedisClusterException):
            return default

    broker = broker_client(r, s)
    tasks = part(lambda: task_metrics(r, s), {})
    live = None
    if workers_timeout is not None:
        live = workers(app or default_app(), workers_timeout)
    return {
        "time": time.time(),
        "lost_slots": reason(ranges) if ranges else "",
        "processes": processes(s),
        "workers": live,
        "queues": queue_depths(broker, s),
        "unacked": unacked(broker, s),
        "active_runs": part(lambda: active_runs(r, s, runs_limit), []),
        "dead_letters": part(lambda: dead_letters(r, s), 0),
        "malformed": part(lambda: malformed(r, s), 0),
        "dead_worker_restored": part(lambda: dead_worker_restored(r, s), 0),
        "unknown_tasks": part(lambda: unknown_tasks(r, s), 0),
        "broken_modules": part(lambda: broken_modules(r, s), []),
        "outbox": part(lambda: outbox(r, s), {}),
        "tasks": {t: {"site": site_of(t), **summary(m)} for t, m in tasks.items()},
        "sites": part(lambda: {site: summary(m) for site, m in site_metrics(r, s).items()}, {}),
        "pools": part(lambda: [h.as_dict() for h in health.collect(r, s)], []),
        "adaptive": part(lambda: adaptive(r, s), []),
        "recrawl": part(lambda: recrawl_watches(r, s), []),
        "fleet": part(lambda: fleet_view(r, s), {}),
        "alerts": part(lambda: alerts.firing(r, s), []),
    }
