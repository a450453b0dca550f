"""Small patches to kombu's Redis transport: they keep a consuming worker alive, and keep a
saturated gevent/solo worker neither idling nor stuck. Each patch's function says what kombu
does without it.

Applied once by `worker.py` at import (`apply()`); every patched function is checked first and
the import fails loudly when kombu no longer has it in the expected shape, rather than running
a worker that silently lacks the protection (docs/reliability.md).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import select
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import kombu as kombu_
import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual
from kombu.transport.virtual import base as kombu_vbase

from utils.redis import known_client_id, socket_client_id, unblock_client

# the internals checked and patched here, which kombu's type hints do not describe
kombu: Any = kombu_
kredis: Any = kombu_redis
virtual: Any = kombu_virtual
vbase: Any = kombu_vbase

log = logging.getLogger("chaincrawl.kombu_guard")

MALFORMED_KEEP = 1000  # payloads kept in {prefix}:broker:malformed (newest first)
MALFORMED_MAX_BYTES = 64 * 1024  # per payload kept; the rest is cut off
BROKER_DOWN = (redis.ConnectionError, redis.TimeoutError, OSError)  # what a failed ack raises
SATURATED_WAIT = 0.5  # most seconds a saturated synloop consumer waits for an ack before polling
LOG_PREVIEW = 200  # payloads up to this size are shown in the log, longer ones only measured
BRPOP_OPTION = "brpop_timeout"  # the transport option read by the long-BRPOP patch
BRPOP_SHORT = 1  # kombu's own BRPOP timeout: used while the BRPOP's client id is unknown

_stage = threading.local()  # what the current _brpop_read of this thread has reached
counts = {
    "malformed": 0,
    "closed_connection": 0,
    "ack_failed": 0,
    "ack_reconnect": 0,
    "restore_sweeps": 0,
    "clients_built": 0,
    "unblocked": 0,
}  # this process, for tests and status


class KombuGuardError(RuntimeError):
    """kombu changed where the guard hooks in: review broker/kombu_guard.py before running."""


def _check() -> None:
    """Fail at import when a function we wrap is gone or no longer does what we rely on."""
    wanted = {
        "kombu.transport.redis.Channel._brpop_read": getattr(kredis.Channel, "_brpop_read", None),
        "kombu.transport.redis.Channel._connparams": getattr(kredis.Channel, "_connparams", None),
        "kombu.transport.redis.MultiChannelPoller.get": getattr(
            kredis.MultiChannelPoller, "get", None
        ),
        "kombu.transport.virtual.Transport._deliver": getattr(virtual.Transport, "_deliver", None),
        "kombu.transport.virtual.Message.__init__": vbase.Message.__dict__.get("__init__"),
        "kombu.transport.virtual.Channel.basic_consume": getattr(
            virtual.Channel, "basic_consume", None
        ),
        "kombu.transport.redis.MultiChannelPoller.on_poll_start": getattr(
            kredis.MultiChannelPoller, "on_poll_start", None
        ),
        "kombu.transport.redis.QoS.ack": kredis.QoS.__dict__.get("ack"),
        "kombu.transport.redis.QoS.reject": kredis.QoS.__dict__.get("reject"),
        "kombu.transport.virtual.Channel.basic_ack": virtual.Channel.__dict__.get("basic_ack"),
        "kombu.transport.virtual.Channel.basic_reject": virtual.Channel.__dict__.get(
            "basic_reject"
        ),
    }
    missing = [name for name, fn in wanted.items() if not callable(fn)]
    if missing:
        raise KombuGuardError(f"kombu {kombu.__version__}: {', '.join(missing)} missing")
    # the stages the guard tracks: _brpop_read hands the decoded payload to _deliver, whose
    # consumer callback builds the Message before anything else
    expectations = [
        (kredis.Channel._brpop_read, "self.connection._deliver("),
        (virtual.Channel.basic_consume, "self.Message(raw_message"),
        (kredis.Channel._connparams, "self.connection.client"),
        (kredis.MultiChannelPoller.get, "self.poller.poll(timeout)"),
        (kredis.MultiChannelPoller.get, "self.on_poll_start()"),
        # the slot is freed (super().ack) only after the Redis call returned
        (kredis.QoS.ack, "_remove_from_indices(delivery_tag).execute()"),
        (kredis.QoS.reject, "super().ack(delivery_tag)"),
        (kredis.MultiChannelPoller.maybe_restore_messages, "restore_visible("),
        (kredis.MultiChannelPoller.get, "self.maybe_restore_messages()"),
        (virtual.Channel.basic_ack, "self.qos.ack(delivery_tag)"),
        (virtual.Channel.basic_reject, "self.qos.reject(delivery_tag"),
        # a client kombu builds is a plain one on the channel's pool (no per-call state)
        (kredis.Channel._create_client, "'connection_pool': self.pool"),
        (kredis.Channel.conn_or_acquire, "yield self._create_client()"),
        # the BRPOP's timeout: the transport's, copied by each channel; close reads the reply
        (kredis.Channel.__init__, "self.brpop_timeout = self.connection.brpop_timeout"),
        (kredis.Channel._brpop_start, "timeout = self.brpop_timeout"),
        (kredis.Channel._brpop_start, "self._in_poll = self.client.connection"),
        (kredis.Channel.close, "self._brpop_read()"),
    ]
    require_source(expectations)
    if not issubclass(kredis.Channel.Message, vbase.Message):
        raise KombuGuardError(f"kombu {kombu.__version__}: Channel.Message is not virtual.Message")


def require_source(expectations: Iterable[tuple[Any, str]]) -> None:
    """Raise KombuGuardError unless every function's source contains its text: what a patch
    repeats or relies on is still there (once applied, the wrapped original is checked)."""
    for fn, text in expectations:
        fn = inspect.unwrap(fn)
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError) as exc:
            raise KombuGuardError(f"kombu {kombu.__version__}: no source for {fn}: {exc}") from exc
        if text not in source:
            raise KombuGuardError(
                f"kombu {kombu.__version__}: {fn.__qualname__} no longer contains {text!r}"
            )


def once(install: Callable[[], None]) -> Callable[[], None]:
    """`install` runs once per process, under a lock: a patch applied twice would wrap itself."""
    lock = threading.Lock()
    done = False

    @functools.wraps(install)
    def apply() -> None:
        nonlocal done
        with lock:
            if not done:
                install()
                done = True

    return apply


@once
def apply() -> None:
    """Install the patches (idempotent)."""
    _check()
    _patch_consumer()
    _patch_connparams()
    _patch_saturated_poll()
    _patch_client_reuse()
    _patch_long_brpop()
    log.debug("kombu %s: consumer guard installed", kombu.__version__)


# --- malformed payloads --------------------------------------------------------------------


def _patch_consumer() -> None:
    """A malformed payload in a queue: `Channel._brpop_read` decodes a popped message in the
    consumer's event loop with nothing around it: a payload that is not JSON (`loads`), a JSON
    value that is not a kombu envelope, or an envelope whose body is not base64
    (`Message.__init__`, reached through `Transport._deliver`) raised out of the loop, and
    Celery shut the worker down ("Unrecoverable error"). The guard follows one `_brpop_read`
    through its stages (reading -> decoded and handed to `_deliver` -> `Message` built, with
    the `delivery_info` the Redis QoS needs) and turns an error raised *before* the message was
    built into a skipped message: logged (a short preview only), kept in a capped list
    `{prefix}:broker:malformed` of the state Redis for inspection, counted in the hash
    `{prefix}:metrics:broker` (`malformed`, `malformed:{queue}`). Errors raised once the
    message exists (Celery's own handling, qos bookkeeping, the connection) propagate exactly
    as before. The payload had already left the queue (BRPOP), so nothing is lost that kombu
    would have kept."""
    brpop_read = kredis.Channel._brpop_read
    deliver = virtual.Transport._deliver
    message_init = vbase.Message.__init__

    def _brpop_read(self: Any, **options: Any) -> Any:
        outer = (
            getattr(_stage, "name", None),
            getattr(_stage, "queue", None),
            getattr(_stage, "payload", None),
        )
        _stage.name, _stage.queue, _stage.payload = "read", None, None
        try:
            return brpop_read(self, **options)
        except Exception as exc:
            found = _malformed(exc)
            if found is None:
                raise
            quarantine(*found)
            raise kredis.Empty() from None  # nothing delivered, as after an empty BRPOP
        finally:
            _stage.name, _stage.queue, _stage.payload = outer

    def _deliver(self: Any, message: Any, queue: str) -> Any:
        if getattr(_stage, "name", None) == "read":
            _stage.name, _stage.queue, _stage.payload = "decoded", queue, message
        return deliver(self, message, queue)

    def __init__(self: Any, payload: Any, channel: Any = None, **kwargs: Any) -> None:
        message_init(self, payload, channel=channel, **kwargs)
        if getattr(_stage, "name", None) == "decoded":
            info = self.delivery_info  # what the Redis QoS files the message under
            if not isinstance(info, dict) or not {"exchange", "routing_key"} <= info.keys():
                raise ValueError("delivery_info has no exchange and routing_key")
            _stage.name = "delivered"  # from here on errors are not the payload's

    for fn, orig in ((_brpop_read, brpop_read), (_deliver, deliver), (__init__, message_init)):
        fn.__wrapped__ = orig  # type: ignore[union-attr]
        fn.__qualname__ = orig.__qualname__
        fn.__doc__ = orig.__doc__
    kredis.Channel._brpop_read = _brpop_read
    virtual.Transport._deliver = _deliver
    vbase.Message.__init__ = __init__


def _malformed(exc: Exception) -> tuple[str, str, str | bytes | None] | None:
    """(queue, error, raw payload) when `exc` is the payload's fault, else None."""
    stage = getattr(_stage, "name", None)
    error = f"{type(exc).__name__}: {exc}"[:500]
    if stage == "read" and isinstance(exc, ValueError):
        # raised after BRPOP answered and before _deliver: `loads` refused the payload
        # (json.JSONDecodeError and orjson's both keep the document in `doc`)
        return "?", f"not JSON: {error}", getattr(exc, "doc", None)
    if stage == "decoded":  # decoded, but Message() failed: not a kombu envelope
        payload = _stage.payload
        try:
            raw: str | None = json.dumps(payload, default=repr)
        except (TypeError, ValueError):
            raw = repr(payload)
        return str(_stage.queue or "?"), f"not a message: {error}", raw
    return None


def quarantine(queue: str, error: str, raw: str | bytes | None) -> None:
    """Log the payload, keep it (capped) and count it; never raise into the event loop."""
    counts["malformed"] += 1
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    size = len(raw) if raw is not None else -1
    shown = repr(raw) if raw is not None and size <= LOG_PREVIEW else f"<{size} chars>"
    try:
        from config import get_settings
        from utils.redis import get_redis

        s = get_settings()
        key = s.key("broker", "malformed")
        record = {
            "at": round(time.time(), 3),
            "queue": queue,
            "error": error,
            "size": size,
            "payload": raw[:MALFORMED_MAX_BYTES] if raw is not None else None,
            "truncated": size > MALFORMED_MAX_BYTES,
        }
        pipe = get_redis(s.redis_url).pipeline(transaction=False)
        pipe.lpush(key, json.dumps(record))
        pipe.ltrim(key, 0, MALFORMED_KEEP - 1)
        pipe.hincrby(s.key("metrics", "broker"), "malformed", 1)
        pipe.hincrby(s.key("metrics", "broker"), f"malformed:{queue}", 1)
        pipe.execute()
        kept = f"kept in {key}"
    except Exception as e:  # the state store may be down: the log line is all we keep
        kept = f"not kept ({type(e).__name__}: {e})"
    log.error(
        "broker: skipped a malformed message from queue %s: %s; payload %s; %s",
        queue,
        error,
        shown,
        kept,
    )


# --- a channel closed after its connection -----------------------------------------------------


def _patch_connparams() -> None:
    """A worker exiting on a Redis restart: when the consumer's connection is closed, kombu
    clears `transport.client` (`Connection._do_close_transport`) while a channel of that
    transport may still be closed later; `Channel.close` -> `QoS.restore_unacked_once` needs a
    new client and `Channel._connparams` reads `self.connection.client.hostname`: an
    AttributeError on None, not one of kombu's connection errors, so Celery reported
    "Unrecoverable error". The guard raises `redis.ConnectionError` there instead: kombu's
    close paths ignore connection errors and Celery reconnects; the messages the channel held
    stay in `unacked` and come back after the visibility timeout."""
    connparams = kredis.Channel._connparams

    def _connparams(self: Any, asynchronous: bool = False) -> Any:
        transport = self.connection
        if transport is None or getattr(transport, "client", None) is None:
            counts["closed_connection"] += 1
            log.warning(
                "kombu: a channel of a closed broker connection needed a new Redis client; "
                "raising a connection error so the consumer reconnects"
            )
            raise redis.ConnectionError(
                "kombu: broker connection already closed (a channel needed a new Redis client "
                "after its connection was released); reconnecting"
            )
        return connparams(self, asynchronous=asynchronous)

    _connparams.__wrapped__ = connparams  # type: ignore[attr-defined]
    _connparams.__qualname__ = connparams.__qualname__
    kredis.Channel._connparams = _connparams


# --- a saturated synloop consumer waiting out its whole poll timeout -----------------------------


def _patch_saturated_poll() -> None:
    """A saturated worker without an event loop (gevent, solo) idling: Celery's `synloop` calls
    `drain_events(timeout=2.0)`; when the QoS is full (every slot and prefetch taken), kombu's
    `MultiChannelPoller.get` registers no BRPOP and waits on the other sockets (the remote-
    control fanout) for the whole timeout (or sleeps 1 s when there are none), and a slot freed
    meanwhile waits for that to end: a task's completion is not a socket event. A CPU-bound
    gevent worker at prefetch 1 ran at a third of a core, taking messages in waves. The guard
    makes every ack set an event and, while a channel's QoS is full, waits for that event (at
    most `SATURATED_WAIT`, then a non-blocking look at the other sockets) instead: a freed slot
    is refilled at once, and a latency-bound worker whose slots all wait on the network does
    not poll. Threads and prefork run Celery's event loop, where a freed slot is seen at once,
    and never reach this wait.

    While a consuming channel's QoS is full, wait for a slot to be freed (an ack: the credit
    a finished task returns is not an fd event the poller could wait for), at most
    `SATURATED_WAIT`, then poll as kombu does. Acks and this wait run in the worker's one OS
    thread (gevent: greenlets), so the event is created lazily, after gevent patched
    `threading`.

    An ack that fails on a connection error (the broker is down or was restarted) leaves its
    message in the QoS: kombu frees the slot only after the Redis call succeeded, and Celery
    logs the error and goes on. A worker whose every slot leaked that way is full for good,
    sends no BRPOP and so never sees that its connection died: the gevent workers of the long
    Redis-restart torture stalled exactly so. The failed ack therefore marks its channel, and
    the poller's next `on_poll_start` (the synloop's `get` and the event loop's tick both call
    it) raises a connection error while that channel is still consuming: Celery reconnects, and
    closing the channel restores its unacknowledged messages (a finished task's repeat is
    skipped by the chain's commit ledger).

    kombu's `get` also sweeps `unacked` (`maybe_restore_messages`: a lock, a read) after every
    poll that found nothing: with a long BRPOP (below) an idle consumer's 2 s polls would sweep
    every 2 s. The guard's own schedule (`_restore_when_due`, every `unacked_restore_interval`)
    is the synloop's one sweep; the event loop's timer calls it outside `get`, unchanged."""
    get = kredis.MultiChannelPoller.get
    poll_start = kredis.MultiChannelPoller.on_poll_start
    basic_ack = virtual.Channel.basic_ack
    basic_reject = virtual.Channel.basic_reject
    restore = kredis.MultiChannelPoller.maybe_restore_messages

    def settled(fn: Any) -> Any:
        """Wake a saturated consumer after an ack or reject; mark the channel when one failed
        on a connection error (kombu frees the slot only after Redis answered)."""

        @functools.wraps(fn)
        def wrapper(self: Any, delivery_tag: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, delivery_tag, *args, **kwargs)
            except BROKER_DOWN as exc:
                self._chaincrawl_ack_failed = f"{fn.__name__}: {type(exc).__name__}: {exc}"[:200]
                counts["ack_failed"] += 1
                raise
            finally:
                ev = _freed[0]
                if ev is not None:
                    ev.set()

        return wrapper

    @functools.wraps(poll_start)
    def checked_poll_start(self: Any) -> Any:
        for ch in self._channels:
            failed = getattr(ch, "_chaincrawl_ack_failed", None)
            if failed and ch.active_queues:
                ch._chaincrawl_ack_failed = None
                counts["ack_reconnect"] += 1
                log.warning(
                    "kombu: an ack failed (%s); reconnecting so the messages it left in the "
                    "prefetch are restored and their slots freed",
                    failed,
                )
                raise redis.ConnectionError(
                    f"kombu: an ack failed ({failed}); reconnecting to free the prefetch"
                )
        return poll_start(self)

    @functools.wraps(restore)
    def scheduled_restore(self: Any) -> Any:
        if getattr(self, "_chaincrawl_in_get", False):  # `get`'s own: _restore_when_due's
            return None
        return restore(self)

    @functools.wraps(get)
    def guarded_get(self: Any, callback: Any, timeout: float | None = None) -> Any:
        _restore_when_due(self)
        self._chaincrawl_in_get = True
        try:
            return _guarded_get(self, callback, timeout)
        finally:
            self._chaincrawl_in_get = False

    def _guarded_get(self: Any, callback: Any, timeout: float | None) -> Any:
        if _saturated(self):
            ev = _freed[0]
            if ev is None:
                ev = _freed[0] = threading.Event()
            ev.clear()
            if _saturated(self):  # no ack came in between
                cap = SATURATED_WAIT if timeout is None else min(timeout, SATURATED_WAIT)
                ev.wait(cap)
            if _saturated(self):  # still full: a quick look at the other sockets only
                timeout = 0
        return get(self, callback, timeout)

    kredis.Channel.basic_ack = settled(basic_ack)  # redis channels only: virtual's stay
    kredis.Channel.basic_reject = settled(basic_reject)
    kredis.MultiChannelPoller.on_poll_start = checked_poll_start
    kredis.MultiChannelPoller.get = guarded_get
    kredis.MultiChannelPoller.maybe_restore_messages = scheduled_restore


_freed: list[threading.Event | None] = [None]  # set by every ack (a slot's credit returned)


def _restore_when_due(poller: Any) -> None:
    """Run kombu's sweep for messages past the visibility timeout every
    `unacked_restore_interval` seconds. The event loop (threads, prefork) has a timer for it;
    the synloop's `get` sweeps only after a poll that found nothing, which a busy gevent worker
    never has: messages whose requeue failed while Redis was down (a task's Reject) stayed in
    `unacked` until the run's sweeper took them for lost (45 of 4,820 in the long Redis-restart
    torture on gevent, 1 on threads)."""
    now = time.monotonic()
    due = getattr(poller, "_chaincrawl_restore_at", None)
    if due is not None and now < due:
        return
    every = min(
        (ch.unacked_restore_interval or 10 for ch in poller._channels if ch.active_queues),
        default=None,
    )
    if every is None:  # nothing consumed yet
        return
    poller._chaincrawl_restore_at = now + every
    if due is not None:
        counts["restore_sweeps"] += 1
        poller.maybe_restore_messages()  # swallows connection errors itself


def _saturated(poller: Any) -> bool:
    return any(ch.active_queues and not ch.qos.can_consume() for ch in poller._channels)


# --- one Redis client per channel for acks, not one per ack -------------------------------------


def _patch_client_reuse() -> None:
    """A Redis client object built for every ack: outside a poll, kombu's `conn_or_acquire`
    builds a new `redis.Redis` on the channel's pool for each ack and reject
    (`Channel._create_client`), and building one copies redis-py's ~250 response callbacks. The
    guard keeps one synchronous client per channel and pool (a `redis.Redis` takes a connection
    from its pool per command, so sharing it across greenlets and threads is safe); a new pool
    gets a new client."""
    create = kredis.Channel._create_client

    @functools.wraps(create)
    def reused_client(self: Any, asynchronous: bool = False) -> Any:
        if asynchronous:
            return create(self, asynchronous=True)
        pool = self.pool
        cached = getattr(self, "_chaincrawl_client", None)
        if cached is not None and cached[0] is pool:
            return cached[1]
        client = create(self, asynchronous=False)
        self._chaincrawl_client = (pool, client)
        counts["clients_built"] += 1
        return client

    kredis.Channel._create_client = reused_client


# --- a long BRPOP that a close does not wait out ---------------------------------------------


def _patch_long_brpop() -> None:
    """An idle consumer's BRPOP every second: kombu sends it with a 1 s server-side timeout
    (`Transport.brpop_timeout`, no option sets it without also making `drain_events` sleep
    between polls), and `Channel.close` reads the BRPOP in flight, so a longer timeout would
    make every warm shutdown and reconnect wait that long. The guard takes the timeout from the
    transport option `brpop_timeout` (broker/app.py) and, when a channel closes with a BRPOP
    in flight, unblocks it from another connection (`CLIENT UNBLOCK <id>`): Redis answers it as
    a timeout, so nothing is popped and nothing is lost, and close goes on at once. The BRPOP
    connection's id is asked once per socket (`CLIENT ID`, before its first BRPOP); where it
    cannot be (a server refusing the command), that BRPOP keeps kombu's 1 s."""
    transport_init = kredis.Transport.__init__
    brpop_start = kredis.Channel._brpop_start
    close = kredis.Channel.close
    basic_consume = kredis.Channel.basic_consume

    @functools.wraps(transport_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        transport_init(self, *args, **kwargs)
        timeout = (self.client.transport_options or {}).get(BRPOP_OPTION)
        if timeout:
            self.brpop_timeout = timeout

    @functools.wraps(brpop_start)
    def long_brpop_start(self: Any, timeout: Any = None) -> Any:
        if timeout is None:
            timeout = self.brpop_timeout
            if timeout > BRPOP_SHORT and _brpop_client_id(self) is None:
                timeout = BRPOP_SHORT
        return brpop_start(self, timeout)

    @functools.wraps(close)
    def unblocking_close(self: Any) -> Any:
        if self._in_poll and not self.closed:
            unblock(self)
        return close(self)

    # a queue consumed while a BRPOP is in flight (Celery's task queues after mingle's reply
    # queue at a worker's start, an added consumer) is not in that BRPOP's keys: unblocked, it
    # is sent again at once with the new queue, not after the rest of its long timeout
    @functools.wraps(basic_consume)
    def consume_at_once(self: Any, queue: Any, *args: Any, **kwargs: Any) -> Any:
        ret = basic_consume(self, queue, *args, **kwargs)
        if self._in_poll and not self.closed and queue not in self._fanout_queues:
            unblock(self)
        return ret

    kredis.Transport.__init__ = init
    kredis.Channel._brpop_start = long_brpop_start
    kredis.Channel.close = unblocking_close
    kredis.Channel.basic_consume = consume_at_once


def _brpop_client_id(channel: Any) -> int | None:
    """The Redis client id of the channel's BRPOP connection, asked once per socket; None when
    the server does not say (nothing is in flight on it: called before a BRPOP is sent)."""
    conn = getattr(channel.client, "connection", None)
    if conn is None:
        return None
    return socket_client_id(conn, "the BRPOP keeps a 1 s timeout")


def unblock(channel: Any) -> bool:
    """End the channel's BRPOP in flight as a timeout (`CLIENT UNBLOCK`, from another
    connection of its pool), so that close need not wait for it; -> whether it returned. A
    BRPOP not blocking yet (sent an instant ago) is unblocked again until its reply is there;
    a broker that does not answer leaves close to read the reply as kombu does."""
    conn = channel._in_poll
    sock = getattr(conn, "_sock", None)
    cid = known_client_id(conn)
    if sock is None or cid is None:
        return False

    def still_blocked(wait: float) -> bool:  # no reply on the BRPOP's socket within `wait`
        return not select.select([sock], [], [], wait)[0]

    try:
        if unblock_client(channel._create_client(), cid, still_blocked) or not still_blocked(0):
            counts["unblocked"] += 1
            return True
    except Exception as exc:  # Redis down: close reads the reply (or the error) itself
        log.debug("kombu: the BRPOP in flight not unblocked: %s", exc)
    return False
