"""The Celery app of the workers: the one place that wires the app, kombu's patches and every
site together, and the signals that start each worker process's background work.

Start workers with `./control.sh start` (or `python -m celery -A worker worker ...`). Every
endpoint module under `sites/` is imported here, so a new module is picked up with no
registration anywhere else. One queue per site plus `resources` and `default`; tasks are routed
by name (`lifecycle.endpoints.route`).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import Celery, signals

import external_interface.resources.proxy.tasks  # noqa: F401 - proxy harvest and validation tasks
import lifecycle.batch  # noqa: F401 - registers the batch task
import scheduling.tasks  # noqa: F401 - the periodic chain trigger and limit checks
import sites
from broker import app as broker_app
from broker import drops, kombu_guard, owners, ready_check
from broker.workers import Beat, TaskSets
from chains.sweeper import Sweeper
from config import Settings, get_settings
from external_interface.resources import holding
from external_interface.resources.base import load_providers
from external_interface.resources.lease import set_lease_guard
from external_interface.resources.pool import known_kinds
from external_interface.storage.outbox import Drainer, drainer_class, on_stored
from ledger.state import RunState
from lifecycle import runtime
from lifecycle.commits import compact_quietly
from lifecycle.endpoints import route
from lifecycle.unknown import dead_letter_unknown, entry_of
from monitor.metrics import aggregator
from monitor.timeseries import Sampler
from scheduling import recrawl
from scheduling.shares import fleet_from_settings
from settings import envcheck
from utils import affinity, logsafe, outage, process
from utils.redis import get_redis

settings = get_settings()
log = logging.getLogger("chaincrawl.worker")
# a malformed queue payload or a channel closed after its connection must not end the consumer
# (docs/reliability.md); the guard fails loudly if kombu changed under the patches
kombu_guard.apply()
drops.apply()  # a dropped broker connection has the sweeper check every run
ready_check.apply()  # gevent: a pooled Redis connection checked without a hub round trip

app = Celery(broker_app.APP_NAME)
broker_app.set_default(app)


def queues() -> list[str]:
    """Every queue a worker may be told to consume: one per site, then resources and default."""
    return list(dict.fromkeys([*sites.sites(), *broker_app.BASE_QUEUES]))


def configure(s: Settings) -> None:
    """(Re)apply settings to the app; tests call it after pointing the environment elsewhere."""
    broker_app.configure(app, s, queues(), route)


broker_app.use_orjson()
sites.load_all()
load_providers()
configure(settings)
set_lease_guard(fleet_from_settings())  # the fleet budget's shares of the pools' leases, if any


# --- signals -----------------------------------------------------------------------------

_drainer: Drainer | None = None
_observing = False  # the re-crawl observer is among this process's on_stored hooks
_sweeper: Sweeper | None = None
_sampler: Sampler | None = None
_beat: Beat | None = None
_background_lock = threading.Lock()
_pinned = ""  # what _pin_core did, logged at worker_ready


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def _redact_logs(logger: logging.Logger, **kw: Any) -> None:
    logsafe.install(logger)
    outage.install(logger)  # a Redis outage: one line when it starts, one when it ends
    if not get_settings().task_log:  # two INFO lines per task, through the redaction filter
        for name in ("celery.app.trace", "celery.worker.strategy", "celery.worker.request"):
            logging.getLogger(name).setLevel(logging.WARNING)


@signals.celeryd_init.connect
def _size_for_pool(conf: Any = None, options: Any = None, **kw: Any) -> None:
    """Size what depends on the pool once the worker's concurrency is known: the process's
    runtime (page slots, batching) and kombu's broker connection pool (acks and publishes
    need one each)."""
    s = get_settings()
    slots = int((options or {}).get("concurrency") or 0)
    if slots <= 0:
        slots = os.cpu_count() or 1  # Celery's default concurrency
    runtime.install(runtime.Runtime(s, slots))
    if conf is not None and not s.broker_max_connections:
        opts = dict(conf.broker_transport_options or {})
        opts["max_connections"] = max(64, slots + 16)
        conf.broker_transport_options = opts


@signals.celeryd_init.connect
def _become_owner(sender: Any = None, **kw: Any) -> None:
    """Redis broker: tag the messages this worker holds unacknowledged with its owner id and
    keep a heartbeat, so that, if it dies, the sweeper restores them in seconds instead of
    after the visibility timeout (broker/owners.py). Before the consumer starts, so
    that every message it takes is tagged."""
    s = get_settings()
    if not s.redis_broker or s.dead_worker_after <= 0:
        return
    owners.start(
        get_redis(s.broker_url), s.broker_key_prefix, s.dead_worker_after, str(sender or "")
    )


@signals.worker_shutdown.connect
def _leave_owners(**kw: Any) -> None:
    """A clean exit is no death: the consumer gave back what it held, so the sweeper need not
    look for a message this worker may have lost (broker/owners.py)."""
    owners.leave()


def _pool_name(pool_cls: Any) -> str:
    """`-P`'s value as a name, whether Celery hands over the alias or the class."""
    raw = pool_cls if isinstance(pool_cls, str) else getattr(pool_cls, "__module__", "")
    raw = raw.lower()
    for name, marker in (
        ("threads", "thread"),
        ("gevent", "gevent"),
        ("eventlet", "eventlet"),
        ("solo", "solo"),
        ("prefork", "prefork"),
    ):
        if marker in raw:
            return name
    return raw


@signals.celeryd_init.connect
def _pin_core(sender: Any = None, conf: Any = None, options: Any = None, **kw: Any) -> None:
    """Pin this worker to one core where its pool gains by it (utils/affinity.py); before the
    pool starts, so every thread it starts inherits the mask."""
    global _pinned
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
        _pinned = f"pinned to core {core} ({pool} pool, CHAINCRAWL_PIN_CORES={mode})"


@signals.worker_ready.connect
def _log_pinning(sender: Any = None, **kw: Any) -> None:
    """Said once logging is set up (at celeryd_init it is not yet)."""
    if _pinned:
        log.info("%s", _pinned)


@signals.worker_ready.connect
def _check_environment(**kw: Any) -> None:
    """A misspelled CHAINCRAWL_* variable would be ignored without a word (settings/envcheck.py)."""
    for problem in envcheck.current(sites.sites(), known_kinds()):
        log.warning("environment: %s", problem)


@signals.worker_ready.connect
def _start_drainer(**kw: Any) -> None:
    """Each worker process drains the item outbox to the sinks in a thread of its own; every
    stored item of a type watched for change is a visit of its key (scheduling/recrawl)."""
    global _drainer, _observing
    with _background_lock:
        if _drainer is None:
            s = get_settings()
            state = RunState(get_redis(s.redis_url), s)
            if not _observing:
                on_stored.append(recrawl.observer(state.r).hook)
                _observing = True
            # runs whose last items this drainer stored are compacted to their summary
            # on a Redis Cluster it reads each run's own outbox stream (outbox/cluster.py)
            _drainer = drainer_class(state.r).from_settings(
                s, runs_hooks=[lambda rids: compact_quietly(state, rids)]
            )
            _drainer.start_thread()


@signals.worker_ready.connect
def _start_sampler(**kw: Any) -> None:
    """Each worker process also samples the numbers the report shows over time, one process
    of the fleet per interval (monitor/timeseries.py)."""
    global _sampler
    with _background_lock:
        if _sampler is None:
            s = get_settings()
            _sampler = Sampler(get_redis(s.redis_url), s)
            _sampler.start_thread()


@signals.worker_ready.connect
def _start_sweeper(**kw: Any) -> None:
    """Each worker process also sweeps the run ledgers for messages the Redis broker lost
    (chains/sweeper.py); a lock lets one process sweep at a time. Off on AMQP."""
    global _sweeper
    with _background_lock:
        if _sweeper is None:
            _sweeper = Sweeper.for_app(app, get_settings())
            if _sweeper is not None:
                _sweeper.start_thread()


@signals.task_prerun.connect
def _task_started(**kw: Any) -> None:
    """A task runs here: the sweeper keeps (or goes back to) its base interval, and so do the
    owner heartbeat, the series sampler and the drainer's claims (utils/process.py; no
    command)."""
    process.note_work()


@signals.task_received.connect
def _received_work(**kw: Any) -> None:
    """The consumer took a task message: work for the idle back-offs of this process, also
    where the task runs in another (a prefork child; utils/process.py; no command)."""
    process.note_work()


@signals.worker_ready.connect
def _publish_task_set(sender: Any = None, **kw: Any) -> None:
    """Say which tasks this worker knows, which queues it consumes and which site modules it
    failed to import, with a heartbeat (broker/workers.py): a trigger refuses a chain whose
    tasks a live worker lacks; status and the `module_broken` alert show the broken ones."""
    global _beat
    consumer_app = getattr(sender, "app", None) or app
    queues = list(consumer_app.amqp.queues.consume_from or {})
    with _background_lock:
        if _beat is None:
            s = get_settings()
            _beat = Beat(
                TaskSets(get_redis(s.redis_url), s),
                str(getattr(sender, "hostname", "") or broker_app.APP_NAME),
                list(consumer_app.tasks),
                queues,
                [b.as_dict() for b in sites.broken()],
            )
            _beat.start()


@signals.task_unknown.connect
def _unknown_task(
    sender: Any = None, message: Any = None, name: str = "", id: str = "", **kw: Any
) -> None:
    """Celery has dropped a message naming a task this worker does not know: fail it and
    dead-letter it, naming the fix, instead of leaving the sweeper to re-send it forever
    (lifecycle/unknown.py)."""
    s = get_settings()
    try:
        try:
            body = message.decode() if message is not None else None
        except Exception:  # an undecodable body: the task fails without its parameters
            body = None
        headers = dict(getattr(message, "headers", None) or {})
        headers.setdefault("id", id)
        headers.setdefault("task", name)
        dead_letter_unknown(
            RunState(get_redis(s.redis_url), s),
            s,
            entry_of(headers, body),
            str(getattr(sender, "hostname", "") or ""),
            app,
        )
    except Exception:  # Redis down: the sweeper re-sends it and the next delivery tries again
        log.exception("dead-lettering unknown task %r (%s) failed", name, id)


@signals.worker_shutdown.connect
def _stop_beat(**kw: Any) -> None:
    """A clean exit leaves the registry of live workers at once."""
    global _beat
    with _background_lock:
        if _beat is not None:
            _beat.stop()
            _beat = None


@signals.worker_shutdown.connect
def _stop_drainer(**kw: Any) -> None:
    """Warm shutdown flushes the last partial batch: the last items are never lost."""
    global _drainer
    with _background_lock:
        if _drainer is not None:
            _drainer.stop()
            _drainer = None


@signals.worker_shutdown.connect
@signals.worker_process_shutdown.connect
def _return_held(**kw: Any) -> None:
    """Warm shutdown gives back every cookie, device and proxy this process holds
    (external_interface/resources/holding.py); one in flight goes back with its feedback."""
    holding.return_all()


@signals.worker_shutdown.connect
@signals.worker_process_shutdown.connect
def _flush_metrics(**kw: Any) -> None:
    """Warm shutdown writes the task metrics this process has not written yet."""
    aggregator().stop(get_redis())
