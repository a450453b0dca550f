"""The Celery app's broker side, built from settings: what every process that sends or consumes
tasks must agree on (broker URL, transport options, queue declarations, serialisation).

`worker` builds the worker's app with `configure` and wires signals, patches and sites onto it;
a process that only sends (a script calling `chains.run`, the CLI) gets an app configured the
same way from `default_app()`, so its messages land where the workers listen.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from celery import Celery
from kombu import Queue, pools
from kombu.serialization import register
from kombu.transport import redis as kombu_redis
from kombu.utils import json as kjson

from config import Settings, get_settings

APP_NAME = "chaincrawl"
BASE_QUEUES = ("resources", "default")  # besides one queue per site

Router = Callable[..., dict[str, Any]]

_default: Celery | None = None
_lock = threading.Lock()


def configure(
    app: Celery, s: Settings, queues: Sequence[str], router: Router | None = None
) -> None:
    """(Re)apply settings to an app; tests call it after pointing the environment elsewhere."""
    names = list(dict.fromkeys([*queues, *BASE_QUEUES]))
    app.conf.update(
        broker_url=s.broker_url,
        result_backend=None,
        # the (disabled) result backend built once per app: Celery keeps a backend that is
        # not "thread safe" in a thread-local, which under gevent is greenlet-local, so the
        # tracer built a new one for every message (a new greenlet each), ~50 µs apiece
        result_backend_thread_safe=True,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=s.prefetch_multiplier,
        # task events feed Flower's task list only; chaincrawl's monitoring reads Redis
        worker_send_task_events=s.task_events,
        task_send_sent_event=s.task_events,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        broker_transport_options=transport_options(s),
        task_queues=[
            Queue(q, routing_key=q, queue_arguments={"x-max-priority": 10}) for q in names
        ],
        task_default_queue="default",
        task_queue_max_priority=10,  # queues declared later (step options) get priorities too
        task_routes=(router,) if router is not None else (),
        worker_hijack_root_logger=True,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    forget_connections(app)


# an idle consumer's BRPOP waits this long on the server: one command per 10 s, not per second;
# a close unblocks the one in flight (broker/kombu_guard.py). A half-open connection is found
# BRPOP_TIMEOUT + 2 * kombu's health_check_interval (25 s) after its last reply at most
BRPOP_TIMEOUT = 10


def transport_options(s: Settings) -> dict[str, Any]:
    """kombu's transport options; the publisher builds Redis envelopes from the same ones."""
    return {
        "visibility_timeout": s.visibility_timeout,
        "priority_steps": list(range(10)),
        "sep": ":",
        # a worker serving several queues takes them in turn within each message priority: a
        # site whose refused tasks keep coming back to its queue (its share of a fleet budget
        # spent) cannot starve the queues after it ("priority" would read them in -Q order)
        "queue_order_strategy": "round_robin",
        # sweep for messages past the visibility timeout a few times per timeout, at most
        # every 2 minutes (a sweep is 5 commands; a dead worker's messages come back sooner
        # through broker/owners.py, and an hour's timeout gains at most 2 minutes)
        "unacked_restore_interval": max(1, min(120, s.visibility_timeout // 4)),
        "unacked_restore_throttle": 1,
        # a worker killed inside a sweep leaves kombu's restore lock behind: let it expire
        # within the visibility timeout, not after kombu's default 300 s
        "unacked_mutex_expire": max(5, min(300, s.visibility_timeout // 2)),
        "brpop_timeout": BRPOP_TIMEOUT,
        "socket_timeout": 30,
        "socket_connect_timeout": 5,
        # kombu's default pool (10) starves gevent pools: acks fail, messages strand
        "max_connections": s.broker_max_connections or 512,
        **({"global_keyprefix": s.broker_key_prefix} if s.redis_broker else {}),
    }


def forget_connections(app: Celery) -> None:
    """Drop connections and cached routing built from a previous configuration, as a fresh
    process would (kombu keeps closed pools registered; Celery caches its queue table)."""
    internals: Any = app  # private caches, not in Celery's type hints
    if internals._pool is not None:
        internals._pool.force_close_all()
        internals._pool = None
    pools.reset()
    amqp: Any = app.amqp
    amqp._producer_pool = None
    for attr in ("queues", "default_queue", "router"):
        amqp.__dict__.pop(attr, None)
    amqp._rtable = None


def set_default(app: Celery) -> None:
    """The app `default_app()` returns: the worker's, once `worker` has built it."""
    global _default
    _default = app


def default_app() -> Celery:
    """The process's chaincrawl app: the worker's where `worker` was imported, else a sending
    app configured from the settings (built once)."""
    global _default
    if _default is None:
        with _lock:
            if _default is None:
                app = Celery(APP_NAME, set_as_current=False)
                configure(app, get_settings(), ())
                _default = app
    return _default


def use_orjson() -> None:
    """kombu's JSON (task bodies, events, the Redis transport's envelopes) through orjson,
    several times faster than the stdlib. Types orjson does not handle natively, and payloads
    carrying kombu's `__type__` markers, take kombu's own encoder/decoder."""
    # datetimes and dataclasses go through kombu's encoder (its `__type__` markers), as before
    opts = (
        orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
    )
    encoder = kjson.JSONEncoder()

    def dumps(obj: Any, **kw: Any) -> str:
        if not kw:
            try:
                return orjson.dumps(obj, default=encoder.default, option=opts).decode()
            except TypeError:  # e.g. tuple subclasses, ints beyond 64 bits: the stdlib path
                pass
        return kjson.dumps(obj, **kw)

    def loads(data: Any, **kw: Any) -> Any:
        if isinstance(data, memoryview):
            data = data.tobytes()
        marker = '"__type__"' if isinstance(data, str) else b'"__type__"'
        if kw or marker in data:
            return kjson.loads(data, **kw)
        return orjson.loads(data)

    register("json", dumps, loads, content_type="application/json", content_encoding="utf-8")
    kombu_redis.dumps, kombu_redis.loads = dumps, loads  # type: ignore[attr-defined]
