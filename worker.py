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
from utils import broker_drops, kombu_guard, logsafe
from utils.registry import UnknownNameError

settings = get_settings()
log = logging.getLogger("chaincrawl.worker")
# a malformed queue payload or a channel closed after its connection must not end the consumer
kombu_guard.apply()  # bugs 6 and 3 (docs/reliability.md); fails loudly if kombu changed
broker_drops.apply()  # a dropped broker connection has the sweeper check every run (bug 1)

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
        # task events feed Flower's task list only; chaincrawl's monitoring reads Redis
        worker_send_task_events=s.task_events,
        task_send_sent_event=s.task_events,
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
            # kombu's default pool (10) starves gevent pools: acks fail, messages strand
            "max_connections": s.broker_max_connections or 512,
            **({"global_keyprefix": s.broker_key_prefix} if s.redis_broker else {}),
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


def use_orjson() -> None:
    """kombu's JSON (task bodies, events, the Redis transport's envelopes) through orjson,
    several times faster than the stdlib. Types orjson does not handle natively, and payloads
    carrying kombu's `__type__` markers, take kombu's own encoder/decoder."""
    import orjson
    from kombu.serialization import register
    from kombu.transport import redis as kombu_redis
    from kombu.utils import json as kjson

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
    kombu_redis.dumps, kombu_redis.loads = dumps, loads


use_orjson()
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
    if not get_settings().task_log:  # two INFO lines per task, through the redaction filter
        for name in ("celery.app.trace", "celery.worker.strategy", "celery.worker.request"):
            logging.getLogger(name).setLevel(logging.WARNING)


@signals.celeryd_init.connect
def _size_for_pool(conf: Any = None, options: Any = None, **kw: Any) -> None:
    """Size what depends on the pool once the worker's concurrency is known: kombu's broker
    connection pool (acks and publishes need one each) and the batching threshold."""
    import base_task

    s = get_settings()
    slots = int((options or {}).get("concurrency") or 0)
    if slots <= 0:
        import os

        slots = os.cpu_count() or 1  # Celery's default concurrency
    base_task.set_worker_slots(slots)
    if conf is not None and not s.broker_max_connections:
        opts = dict(conf.broker_transport_options or {})
        opts["max_connections"] = max(64, slots + 16)
        conf.broker_transport_options = opts


@signals.celeryd_init.connect
def _become_owner(sender: Any = None, **kw: Any) -> None:
    """Redis broker: tag the messages this worker holds unacknowledged with its owner id and
    keep a heartbeat, so that, if it dies, the sweeper restores them in seconds instead of
    after the visibility timeout (utils/unacked_owners.py). Before the consumer starts, so
    that every message it takes is tagged."""
    from utils import unacked_owners
    from utils.redis import get_redis

    s = get_settings()
    if not s.redis_broker or s.dead_worker_after <= 0:
        return
    unacked_owners.start(
        get_redis(s.broker_url), s.broker_key_prefix, s.dead_worker_after, str(sender or "")
    )


@signals.worker_shutdown.connect
def _leave_owners(**kw: Any) -> None:
    """A clean exit is no death: the consumer gave back what it held, so the sweeper need not
    look for a message this worker may have lost (utils/unacked_owners.py)."""
    from utils import unacked_owners

    unacked_owners.leave()


def _pool_name(pool_cls: Any) -> str:
    """`-P`'s value as a name, whether Celery hands over the alias or the class."""
    raw = pool_cls if isinstance(pool_cls, str) else getattr(pool_cls, "__module__", "")
    raw = raw.lower()
    for name, marker in (("threads", "thread"), ("gevent", "gevent"), ("eventlet", "eventlet"),
                         ("solo", "solo"), ("prefork", "prefork")):  # fmt: skip
        if marker in raw:
            return name
    return raw


_pinned = ""  # what _pin_core did, logged at worker_ready


@signals.celeryd_init.connect
def _pin_core(sender: Any = None, conf: Any = None, options: Any = None, **kw: Any) -> None:
    """Pin this worker to one core where its pool gains by it (utils/affinity.py); before the
    pool starts, so every thread it starts inherits the mask."""
    import os

    from utils import affinity

    mode = get_settings().pin_cores
    if mode == "off" or not affinity.supported():
        return
    opts = options or {}  # `-P` arrives as `pool` (the class); `pool_cls` from app.Worker()
    pool = _pool_name(
        opts.get("pool") or opts.get("pool_cls") or getattr(conf, "worker_pool", "") or "prefork"
    )
    core = affinity.core_for(mode, pool, str(sender or ""), affinity.allowed())
    if core is not None:
        affinity.pin_threads(os.getpid(), {core})
        global _pinned
        _pinned = f"pinned to core {core} ({pool} pool, CHAINCRAWL_PIN_CORES={mode})"


@signals.worker_ready.connect
def _log_pinning(sender: Any = None, **kw: Any) -> None:
    """Said once logging is set up (at celeryd_init it is not yet)."""
    if _pinned:
        logging.getLogger(__name__).info("%s", _pinned)


@signals.worker_ready.connect
def _check_environment(**kw: Any) -> None:
    """A misspelled CHAINCRAWL_* variable would be ignored without a word (utils/envcheck.py)."""
    from utils import envcheck

    for problem in envcheck.current():
        log.warning("environment: %s", problem)


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


_sweeper: Any = None


@signals.worker_ready.connect
def _start_sweeper(**kw: Any) -> None:
    """Each worker process also sweeps the run ledgers for messages the Redis broker lost
    (bug 1, chains/sweeper.py); a lock lets one process sweep at a time. Off on AMQP."""
    global _sweeper
    from chains.sweeper import Sweeper

    with _drainer_lock:
        if _sweeper is None:
            _sweeper = Sweeper.for_app(app, get_settings())
            if _sweeper is not None:
                _sweeper.start_thread()


@signals.worker_shutdown.connect
def _stop_drainer(**kw: Any) -> None:
    """Warm shutdown flushes the last partial batch (seed 004: never lose the last batch)."""
    global _drainer
    with _drainer_lock:
        if _drainer is not None:
            _drainer.stop()
            _drainer = None


@signals.worker_shutdown.connect
@signals.worker_process_shutdown.connect
def _flush_metrics(**kw: Any) -> None:
    """Warm shutdown writes the task metrics this process has not written yet."""
    from monitor.metrics import aggregator
    from utils.redis import get_redis

    aggregator().stop(get_redis())
