"""One Redis client per process and URL, safe across fork (prefork children reconnect).

A `redis+cluster://host:port[,host:port...]` URL (`rediss+cluster://` with TLS) gives a
`redis.cluster.RedisCluster`: the same command surface, each command sent to the master of its
keys' slot, and a moved slot or a promoted replica followed on its own. The state store may be
a cluster; the broker never is (config refuses it).
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, ClusterPipeline, PipelineCommand, RedisCluster
from redis.commands.core import Script
from redis.retry import Retry

from config import get_settings, is_cluster_url
from utils.process import pid
from utils.redis_pool import LeanPool, lean_kwargs
from utils.slots import SlotsLost, lost_now

log = logging.getLogger("chaincrawl.redis")
_lock = threading.Lock()
_clients: dict[tuple[str, int], redis.Redis] = {}

_TIMEOUTS: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": 30}

# What a Redis restarting or loading its data looks like to a client (BusyLoadingError, the
# LOADING reply, is a ConnectionError)
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    socket.timeout,
)

Notify = Callable[[Exception | None], None]


class _Outage:
    """One message when calls start failing, one when they work again, however many
    clients and connections wait meanwhile; and one deadline for all of them (a reconnect
    retried inside a retried command must not wait twice as long)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.notify: Notify | None = None
        self.since: float | None = None  # when calls began to fail

    def failed(self, error: Exception) -> float:
        """-> when this outage began."""
        with self.lock:
            if self.since is not None:
                return self.since
            self.since = since = time.monotonic()
        if self.notify is not None:
            self.notify(error)
        return since

    def worked(self) -> None:
        with self.lock:
            if self.since is None:
                return
            self.since = None
        if self.notify is not None:
            self.notify(None)


_outage = _Outage()
_patience: float | None = None  # None: redis-py's own few retries (workers: Celery retries)
_reached = False  # a call of this process's patient clients has worked once


def not_there(error: BaseException) -> bool:
    """Whether `error` says nothing listens at the address (connection refused, a host name
    that does not resolve) or that the password is wrong: no restart or load to wait for."""
    if isinstance(error, redis.AuthenticationError):
        return True
    cause = error.__cause__ or error.__context__
    if isinstance(cause, ConnectionRefusedError | socket.gaierror):
        return True
    return "Connection refused" in str(error)


class PatientRetry(Retry):
    """Retries a call through a Redis restart or a Redis loading its data, for up to
    `patience` seconds (backing off up to 1 s), saying so once through `notify`; then the
    last error is raised. redis-py's own `Retry` counts attempts, not time.

    Until a call of this process has worked once, a refused connection (or a wrong password)
    is raised at once: that is a Redis that is not there, not one restarting."""

    def __init__(self, patience: float) -> None:
        super().__init__(ExponentialBackoff(cap=1.0, base=0.05), 1_000_000, OUTAGE_ERRORS)
        self.patience = patience

    def call_with_retry(
        self,
        do: Callable[[], Any],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> Any:
        global _reached
        self._backoff.reset()
        failures = 0
        while True:
            try:
                out = do()
            except self._supported_errors as error:
                if is_retryable and not is_retryable(error):
                    raise
                if isinstance(error, redis.AuthenticationError) or (
                    not _reached and not_there(error)
                ):
                    raise
                failures += 1
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)
                deadline = _outage.failed(error) + self.patience
                now = time.monotonic()
                if now >= deadline:
                    raise
                time.sleep(min(self._backoff.compute(failures), deadline - now))
            else:
                _reached = True
                if failures:
                    _outage.worked()
                return out


def reached() -> bool:
    """Whether a call of this process's patient clients has worked once: a refused
    connection after that is a node gone (a restart, a failover), not a wrong address."""
    return _reached


def patiently(
    do: Callable[[], Any], retry: Callable[[Exception], None] | None = None, client: Any = None
) -> Any:
    """`do()` through a cluster's failover: redis-py's cluster client reads the slot map again
    after a node fails but retries a few times at once, within a second, while a replica
    takes a dead master's slots only after the cluster's node timeout. So each attempt here
    follows the slot map redis-py refreshed, backing off up to 1 s, until `_patience` runs
    out (one deadline for the whole outage, said once, as `PatientRetry`); `retry(error)`
    readies the next attempt (or raises). A node that refuses before anything worked is
    raised at once; so is a slot range the cluster of `client` has lost (`utils.slots`), as
    `SlotsLost`: waiting does not bring a master and its replicas back."""
    global _reached
    backoff = ExponentialBackoff(cap=1.0, base=0.05)
    failures = 0
    while True:
        try:
            out = do()
        except RedisCluster.ERRORS_ALLOW_RETRY as error:
            if isinstance(error, redis.AuthenticationError) or (not _reached and not_there(error)):
                raise
            if client is not None and (ranges := lost_now(client, error)):
                raise SlotsLost(ranges) from error
            failures += 1
            deadline = _outage.failed(error) + (_patience or 0.0)
            now = time.monotonic()
            if now >= deadline:
                raise
            time.sleep(min(backoff.compute(failures), deadline - now))
            if retry is not None:
                retry(error)
        else:
            _reached = True
            if failures:
                _outage.worked()
            return out


class PatientCluster(RedisCluster):
    """A cluster client that rides out a failover (`patiently`): the CLI's, with
    CHAINCRAWL_REDIS_WAIT as the deadline."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        return patiently(
            lambda: super(PatientCluster, self).execute_command(*args, **kwargs), client=self
        )

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        pipe.__class__ = PatientPipeline

        def one(*args: Any, **options: Any) -> Any:  # a command a node failed, sent alone
            return patiently(
                lambda: RedisCluster.execute_command(pipe, *args, **options), client=pipe
            )

        pipe.parent_execute_command = one  # redis-py's per-command retry, made patient
        return pipe


class PatientPipeline(ClusterPipeline):
    """A cluster pipeline through a failover. The commands a failed node did not answer are
    sent again one at a time, each patiently, by redis-py's own retry (the others are not
    sent twice); a pipeline that failed before any command went out (no connection to a
    node) is sent again whole (redis-py empties it on any error)."""

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        strategy: Any = self._execution_strategy  # a PipelineStrategy: its queue is settable
        sent = list(strategy.command_queue)
        queued = [(c.args, dict(c.options)) for c in sent]

        def again(error: Exception) -> None:
            if any(c.result is not None for c in sent):  # some went out: never twice
                raise error
            sent[:] = [PipelineCommand(a, dict(o), n) for n, (a, o) in enumerate(queued)]
            strategy.command_queue = list(sent)

        return cast(
            list[Any],
            patiently(lambda: ClusterPipeline.execute(self, raise_on_error), again, self),
        )


def failed_node(error: BaseException) -> str:
    """host:port of the node a Redis error came from ("" if it does not say): a cluster
    client names the node it gave up on, not the startup node of the URL."""
    conn = getattr(error, "connection", None)
    host, port = getattr(conn, "host", None), getattr(conn, "port", None)
    if host and port:
        return f"{host}:{port}"
    found = re.search(r"connecting to ([\w.\-\[\]:]+:\d+)", str(error))
    return found.group(1) if found else ""


def hostport(url: str) -> tuple[str, int]:
    """Where a Redis URL points (a cluster's: its first listed node, the startup node)."""
    if is_cluster_url(url):
        first = url.split("://", 1)[1].rpartition("@")[2].split(",")[0]
        host, _, port = first.rpartition(":")
        return host or "127.0.0.1", int(port or 6379)
    u = urlsplit(url)
    return u.hostname or "127.0.0.1", u.port or 6379


def address(url: str) -> str:
    """`host:port` of `hostport(url)`: how a message names the Redis it could not reach."""
    host, port = hostport(url)
    return f"{host}:{port}"


def be_patient(patience: float, notify: Notify | None = None) -> None:
    """Clients made from now on in this process wait out a Redis restart or load for up to
    `patience` seconds (the CLI: CHAINCRAWL_REDIS_WAIT), calling `notify(error)` once when
    the wait begins and `notify(None)` once Redis answers again. A cluster client waits out a
    failover the same way (`PatientCluster`)."""
    global _patience
    _patience = patience
    _outage.notify = notify
    reset_clients()


def get_redis(url: str | None = None) -> redis.Redis:
    """A shared, thread-safe client (redis-py pools connections per client); a
    `RedisCluster` for a cluster URL (typed as `redis.Redis`: callers use the common commands).

    Keyed by pid so a forked child never reuses its parent's sockets.
    """
    url = url or get_settings().redis_url
    key = (url, pid())
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                if is_cluster_url(url):
                    client = cast(redis.Redis, cluster_client(url))
                else:
                    extra: dict[str, Any] = {}
                    if _patience is not None:
                        extra = {"retry": PatientRetry(_patience), "retry_on_error": OUTAGE_ERRORS}
                    pool = LeanPool.from_url(
                        url,
                        health_check_interval=30,
                        retry_on_timeout=True,
                        **_TIMEOUTS,
                        **extra,
                        **lean_kwargs(),
                    )
                    client = redis.Redis(connection_pool=pool)
                    client.auto_close_connection_pool = True  # as Redis.from_url's own
                _clients[key] = client
    return client


def cluster_client(url: str, **kw: Any) -> RedisCluster:
    """A `RedisCluster` from `redis[s]+cluster://[user:password@]host:port[,host:port...]`:
    every listed node is a startup node (any one that answers gives the whole slot map)."""
    global _reached
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    nodes = []
    for hp in hosts.split(","):
        host, _, port = hp.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"cluster node {hp!r}: host:port expected")
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    cls = RedisCluster if _patience is None else PatientCluster
    opts: dict[str, Any] = dict(_TIMEOUTS)
    if user:
        opts["username"] = unquote(user)
    if password:
        opts["password"] = unquote(password)
    if parts.scheme.startswith("rediss"):
        opts["ssl"] = True
    query = parse_qs(parts.query)
    if "read_from_replicas" in query:
        opts["read_from_replicas"] = query["read_from_replicas"][0] in ("1", "true", "yes")
    client = cls(startup_nodes=nodes, **{**opts, **kw})
    if cls is PatientCluster:  # a node answered with the slot map: a refusal now is a failure
        _reached = True
    client.commands_parser = StreamKeys(client.commands_parser)  # type: ignore[assignment]  # its pipelines share it
    client.register_script = lambda script: NodeScript(client, script)  # type: ignore[method-assign]
    return client


class NodeScript(Script):
    """A registered script of a cluster client: a NOSCRIPT (a restarted or flushed master)
    is answered by `eval_script`, EVAL on the node of the call's keys, which caches it there;
    redis-py's `Script` would SCRIPT LOAD it on every master first (a round trip each, and an
    error while any master is down)."""

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        client = client or self.registered_client
        if not is_cluster(client):  # a plain Redis or pipeline: redis-py's own way
            return super().__call__(keys, args, client)
        return eval_script(client, self, list(keys or ()), list(args or ()))


SCRIPT_CALLS = ("EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO")
"""Commands whose keys follow their script (or function) and key count."""


class StreamKeys:
    """The keys of XREADGROUP and XREAD (the stream names after STREAMS) and of EVAL, EVALSHA
    and FCALL (the `numkeys` after the script) read from the command itself. redis-py routes
    a command with "movable keys" by asking its default node (`COMMAND GETKEYS`) each time it
    is sent: a round trip and a node's CPU per stream read of every drainer poll, and in a
    cluster pipeline per script call too. That default node is the master of slot 0: while
    its range is lost every such pipeline failed, whatever slots its commands were for (the
    drainer's acknowledgements of every run). Every other command goes to redis-py's parser."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get_keys(self, redis_conn: Any, *args: Any) -> Any:
        name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
        if name.upper() in ("XREADGROUP", "XREAD"):
            words = [a.decode("utf-8", "replace") if isinstance(a, bytes) else str(a) for a in args]
            upper = [w.upper() for w in words]
            if "STREAMS" in upper:
                names = args[upper.index("STREAMS") + 1 :]
                return list(names[: len(names) // 2])
        if name.upper() in SCRIPT_CALLS and len(args) >= 3:
            return list(args[3 : 3 + int(args[2])]) or None
        return self._inner.get_keys(redis_conn, *args)


class NotReplicated(redis.exceptions.TimeoutError):
    """A write was not confirmed by enough replicas in time (`wait_replicas`): the caller
    treats it as a timeout of the state store (a task's message is requeued, not acked)."""


class ReplicaOutage:
    """Writes refused for want of replicas, as a worker's log says it: one warning line when
    the refusals start (`refused`), one when a WAIT is confirmed again, the count between."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.since: float | None = None
        self.refusals = 0

    def refused(self) -> bool:
        """A refusal: True for the first of an outage (the caller says it)."""
        with self.lock:
            self.refusals += 1
            if self.since is not None:
                return False
            self.since = time.monotonic()
            return True

    def confirmed(self) -> None:
        if self.since is None:  # the common case, without the lock
            return
        with self.lock:
            if self.since is None:
                return
            took, n = time.monotonic() - self.since, self.refusals
            self.since, self.refusals = None, 0
        log.warning(
            "replicas confirm writes again after %.1fs (%d message(s) requeued meanwhile)", took, n
        )


REPLICAS = ReplicaOutage()


def wait_replicas(client: Any, keys: Sequence[str], replicas: int, timeout: float) -> None:
    """Block until `replicas` replicas hold every write made so far to the masters of `keys`
    (once per master on a cluster); raise `NotReplicated` when fewer confirm in `timeout` s.

    WAIT counts the writes of its own connection, and the writes to wait for went out on
    others (a pipeline's): so each master gets a tiny write of ours (a marker key beside the
    first of `keys`, gone after a minute) and WAIT, in one pipeline on one connection, which
    covers every write that master applied before."""
    if replicas <= 0 or not keys:
        return
    ms = max(1, int(timeout * 1000))
    if is_cluster(client):
        by_node: dict[str, tuple[Any, str]] = {}
        for k in keys:
            node = client.get_node_from_key(k)
            by_node.setdefault(node.name, (client.get_redis_connection(node), k))
        targets = list(by_node.items())
    else:
        targets = [("", (client, keys[0]))]
    for name, (node_client, key) in targets:
        pipe = node_client.pipeline(transaction=False)
        pipe.set(f"{key}:replicated", "1", px=60_000)
        pipe.execute_command("WAIT", replicas, ms)
        got = int(pipe.execute()[-1])
        if got < replicas:
            where = f" on {name}" if name else ""
            raise NotReplicated(f"{got} of {replicas} replicas confirmed the write{where}")
    REPLICAS.confirmed()


def is_cluster(client: Any) -> bool:
    """Whether a client (or a pipeline of one) talks to a Redis Cluster."""
    return isinstance(client, RedisCluster) or type(client).__name__ == "ClusterPipeline"


def pipeline(client: redis.Redis, transaction: bool = True) -> Any:
    """`client.pipeline(transaction)`, without MULTI on a cluster, where a transaction cannot
    span slots: callers whose keys share a hash tag keep their atomicity from a script, not
    from MULTI (each command is still applied once, in order per slot)."""
    return client.pipeline(transaction=transaction and not is_cluster(client))


def reset_clients() -> None:
    """Drop cached clients (tests that switch servers call this)."""
    with _lock:
        _clients.clear()


def eval_script(
    client: redis.Redis, script: Any, keys: Sequence[Any], args: Sequence[Any], **options: Any
) -> Any:
    """One registered script's call (`script.sha`): EVALSHA, and on NOSCRIPT (a restarted or
    flushed server) EVAL of its code, which the node that answered NOSCRIPT caches. Not
    `Script.__call__`: its SCRIPT LOAD goes to every master of a cluster (a round trip each,
    and an error while any master is down, though only one lost the script). `options` go to
    `execute_command` (`NEVER_DECODE=True`: a binary reply, whatever the client decodes)."""
    try:
        return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args, **options)
    except redis.exceptions.NoScriptError:
        code = as_str(script.script)
        return client.execute_command("EVAL", code, len(keys), *keys, *args, **options)


def eval_scripts(
    client: redis.Redis, calls: Sequence[tuple[Any, Sequence[Any], Sequence[Any]]]
) -> list[Any]:
    """Run several registered scripts (`(script, keys, args)`) in one round trip.

    A pipeline of `Script` objects first asks `SCRIPT EXISTS` on every execute (a second round
    trip); plain EVALSHAs do not, and the rare NOSCRIPT (a restarted or flushed server) runs
    that call again on its own by EVAL, on the node of its keys alone (`eval_script`)."""
    if len(calls) == 1:
        script, keys, args = calls[0]
        return [eval_script(client, script, keys, args)]
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)  # cluster-safe too
    results = pipe.execute(raise_on_error=False)
    for i, res in enumerate(results):
        if isinstance(res, redis.exceptions.NoScriptError):
            script, keys, args = calls[i]
            results[i] = client.eval(as_str(script.script), len(keys), *keys, *args)
        elif isinstance(res, Exception):
            raise res
    return results


def as_str(value: object) -> str:
    """A Redis reply as text (our clients do not decode responses; None reads as ""). Any
    reply: redis-py's hints cover every reply shape of a command, and decoding clients too."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


# --- a blocking command another connection can end -------------------------------------------

UNBLOCK_TRIES = 20  # CLIENT UNBLOCKs, UNBLOCK_PAUSE apart, while the command has not returned
UNBLOCK_PAUSE = 0.1


def socket_client_id(conn: redis.Connection, refused: str = "") -> int | None:
    """The Redis client id of `conn`'s socket (`CLIENT ID`), asked once per socket: a
    reconnect asks again. Send it only while nothing is in flight on `conn`. None when the
    server refuses the command (an ACL without CLIENT), logged once per socket with
    `refused` (what the caller does instead)."""
    if conn._sock is None:
        conn.connect()
    known = getattr(conn, "_chaincrawl_id", None)
    if known is not None and known[0] is conn._sock:
        return cast("int | None", known[1])
    cid: int | None = None
    try:
        conn.send_command("CLIENT", "ID")
        cid = int(conn.read_response())
    except redis.ResponseError as exc:
        log.warning("CLIENT ID refused (%s)%s", exc, f"; {refused}" if refused else "")
    conn._chaincrawl_id = (conn._sock, cid)  # type: ignore[attr-defined]
    return cid


def known_client_id(conn: Any) -> int | None:
    """The client id `socket_client_id` found for `conn`'s current socket, else None (never
    asked, refused, or the socket changed since): no command is sent."""
    sock = getattr(conn, "_sock", None)
    known = getattr(conn, "_chaincrawl_id", None)
    if sock is None or known is None or known[0] is not sock:
        return None
    return cast("int | None", known[1])


def unblock_client(
    client: Any, cid: int, still_blocked: Callable[[float], bool], tries: int = UNBLOCK_TRIES
) -> bool:
    """End connection `cid`'s blocking command (`CLIENT UNBLOCK`, through `client`: another
    connection); Redis answers it as a timeout. -> whether Redis said it ended one. A command
    sent an instant ago may not block yet: the UNBLOCK is sent again while
    `still_blocked(UNBLOCK_PAUSE)` (which may wait that long for the command to return) says
    it has not returned, up to `tries` UNBLOCKs. Redis errors are the caller's."""
    for _ in range(tries):
        if client.execute_command("CLIENT", "UNBLOCK", cid):
            return True
        if not still_blocked(UNBLOCK_PAUSE):
            return False
    return False
