"""The Celery app: configuration, explicit import of every endpoint, queues, routes, signals.

Start workers with `./control.sh start` (or `python -m celery -A worker worker ...`).
Every endpoint module under `sites/` is imported here, so a new module is picked up with no
registration anywhere else. One queue per site plus `resources`; tasks are routed by name.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, signals
from kombu import Queue

import sites
from base_task import get_endpoint
from config import Settings, get_settings
from external_interface.base import load_providers
from utils import logsafe
from utils.registry import UnknownNameError

settings = get_settings()
log = logging.getLogger("chaincrawl.worker")

app = Celery("chaincrawl")


def route(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> dict:
    """Endpoint tasks go to their site's queue, resource tasks to `resources`."""
    if name.startswith("resources."):
        return {"queue": "resources"}
    try:
        return {"queue": get_endpoint(name).queue}
    except UnknownNameError:
        return {"queue": "default"}


def queues() -> list[str]:
    return list(dict.fromkeys([*sites.sites(), "resources", "default"]))


def configure(s: Settings) -> None:
    """(Re)apply settings to the app; tests call it after pointing the environment elsewhere."""
    redis_broker = s.broker_url.startswith(("redis", "rediss", "unix"))
    app.conf.update(
        broker_url=s.broker_url,
        result_backend=None,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=s.prefetch_multiplier,
        worker_send_task_events=True,
        task_send_sent_event=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        broker_transport_options={
            "visibility_timeout": s.visibility_timeout,
            "priority_steps": list(range(10)),
            "sep": ":",
            "queue_order_strategy": "priority",
            # sweep for messages abandoned by a killed worker a few times per visibility timeout
            "unacked_restore_interval": max(1, min(10, s.visibility_timeout // 4)),
            "unacked_restore_throttle": 1,
            # a worker killed inside a sweep leaves kombu's restore lock behind: let it
            # expire within the visibility timeout, not after kombu's default 300 s
            "unacked_mutex_expire": max(5, min(300, s.visibility_timeout // 2)),
            "socket_timeout": 30,
            "socket_connect_timeout": 5,
            **({"global_keyprefix": f"{s.key_prefix}:q:"} if redis_broker else {}),
        },
        task_queues=[
            Queue(q, routing_key=q, queue_arguments={"x-max-priority": 10}) for q in queues()
        ],
        task_default_queue="default",
        task_queue_max_priority=10,  # queues declared later (step options) get priorities too
        task_routes=(route,),
        worker_hijack_root_logger=True,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    _forget_connections()


def _forget_connections() -> None:
    """Drop connections and cached routing built from a previous configuration, as a fresh
    process would (kombu keeps closed pools registered; Celery caches its queue table)."""
    from kombu import pools

    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    pools.reset()
    amqp = app.amqp
    amqp._producer_pool = None
    for attr in ("queues", "default_queue", "router"):
        amqp.__dict__.pop(attr, None)
    amqp._rtable = None


sites.load_all()
load_providers()  # providers register their tasks (production chains) on import
configure(settings)

_optional_modules = [
    "external_interface.production",  # resource production chains (cookies, devices)
    "external_interface.proxy_tasks",
    "external_interface.resource_tasks",
    "scheduling.tasks",
]
for _mod in _optional_modules:
    try:
        __import__(_mod)
    except ImportError as exc:  # a resources module not present in this deployment
        if exc.name != _mod:
            raise


# --- signals -----------------------------------------------------------------------------

_drainer: Any = None
_drainer_lock = threading.Lock()


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def _redact_logs(logger: logging.Logger, **kw: Any) -> None:
    logsafe.install(logger)


@signals.worker_ready.connect
def _start_drainer(**kw: Any) -> None:
    """Each worker process drains the item outbox to the sinks in a thread of its own."""
    global _drainer
    try:
        from external_interface.outbox import Drainer
    except ImportError:
        log.warning("external_interface.outbox missing: items stay in the outbox stream")
        return
    with _drainer_lock:
        if _drainer is None:
            _drainer = Drainer.from_settings(get_settings())
            _drainer.start_thread()


@signals.worker_shutdown.connect
def _stop_drainer(**kw: Any) -> None:
    """Warm shutdown flushes the last partial batch (seed 004: never lose the last batch)."""
    global _drainer
    with _drainer_lock:
        if _drainer is not None:
            _drainer.stop()
            _drainer = None
