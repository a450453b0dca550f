"""Prototypes of per-page CPU optimizations, applied at runtime to measure their effect.

For measurement only: `bench/tuned_worker.py` (a Celery app module wrapping `worker`) applies
the flags named in `BENCH_PROTO` (comma-separated) inside benchmark worker processes. Nothing
here is imported by production code; the accepted changes belong in the core files, as
described in docs/performance.md. Patches copy small pieces of core code; if the core changes,
re-check them before trusting a measurement.

Flags:
    noevents      no Celery task events (worker_send_task_events / task_send_sent_event off;
                  the harness also drops `-E`)
    quietlog      per-task INFO lines ("Task ... received/succeeded") off
    batchpublish  a task's children sent through one kombu `Producer.batch()` (kombu >= 5.7):
                  one pipeline for all LPUSHes (and task-sent events), one Redis client
    rawpublish    children LPUSHed as ready Celery protocol-2 envelopes in one redis-py
                  pipeline together with the DEL of the staging list (no kombu, no celery
                  send_task, no task-sent event)
    commitkids    the commit script returns the staged children (no LRANGE round trip) and is
                  called with EVALSHA inside the pipeline (no SCRIPT EXISTS round trip)
    evalsha       only the EVALSHA part of commitkids
    urllib3       the fetch layer on a shared urllib3 PoolManager instead of requests.Session
    orjson        kombu's JSON (task bodies, envelopes, events) through orjson
    nometrics     TaskMetrics.flush is a no-op (an upper bound of what cheaper metrics save)
    lazyattrs     Response.encoding/text/selector cached without functools.cached_property,
                  whose Python 3.11 implementation takes one RLock per *class*: every thread's
                  first `.css()` on any response queues on the same lock
    brokerpool    kombu's Redis channel pool sized for the pool (`max_connections` 512 instead
                  of kombu's 10): under gevent(256) acks otherwise fail with MaxConnectionsError
                  ("Couldn't ack") and the unacked messages stall the run for the visibility
                  timeout
    batch         N pages per Celery message: a task's children (grouped by task, queue and
                  priority) go out as `chaincrawl.batch` messages of up to BENCH_BATCH (20)
                  entries when the run has at least BENCH_BATCH_BACKLOG (64) outstanding
                  tasks (else one message per child, so ramp-up and tail keep every slot
                  busy; needs commitkids, which returns the count); the batch task runs each
                  entry through SiteTask.execute (own task id, begin, commit) and publishes
                  all their children in one pipeline
    all           every flag above except nometrics, batch and batchpublish/evalsha (implied
                  or superseded)
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import time
import uuid
from typing import Any

import orjson

ALL = (
    "noevents",
    "quietlog",
    "rawpublish",
    "commitkids",
    "urllib3",
    "orjson",
    "brokerpool",
    "lazyattrs",
)
log = logging.getLogger("bench.proto")


def flags(value: str | None = None) -> set[str]:
    raw = os.environ.get("BENCH_PROTO", "") if value is None else value
    out = {f.strip() for f in raw.split(",") if f.strip()}
    if "all" in out:
        out.discard("all")
        out.update(ALL)
    return out


def apply(app: Any, wanted: set[str]) -> None:
    for name in sorted(wanted):
        fn = globals().get(f"_p_{name}")
        if fn is None:
            raise ValueError(f"unknown BENCH_PROTO flag {name!r}")
        fn(app, wanted)
    if wanted:
        log.warning("bench prototypes on: %s", ",".join(sorted(wanted)))


# --- configuration only -------------------------------------------------------------------


def _p_noevents(app: Any, wanted: set[str]) -> None:
    app.conf.update(worker_send_task_events=False, task_send_sent_event=False)


def _p_quietlog(app: Any, wanted: set[str]) -> None:
    from celery import signals

    @signals.after_setup_logger.connect(weak=False)
    def _quiet(**kw: Any) -> None:
        for name in ("celery.app.trace", "celery.worker.strategy", "celery.worker.request"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _p_orjson(app: Any, wanted: set[str]) -> None:
    import kombu.transport.redis as kr
    from kombu.serialization import register

    def dumps(obj: Any) -> str:
        return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS).decode()

    register("json", dumps, orjson.loads, content_type="application/json",
             content_encoding="utf-8")  # fmt: skip
    kr.dumps, kr.loads = dumps, orjson.loads


def _p_brokerpool(app: Any, wanted: set[str]) -> None:
    opts = dict(app.conf.broker_transport_options or {})
    opts["max_connections"] = 512
    app.conf.broker_transport_options = opts


def _p_nometrics(app: Any, wanted: set[str]) -> None:
    from monitor.metrics import TaskMetrics

    TaskMetrics.flush = lambda self, *a, **kw: self.counts.clear()  # type: ignore[method-assign]


# --- child dispatch -----------------------------------------------------------------------

_tls = threading.local()


def _p_batchpublish(app: Any, wanted: set[str]) -> None:
    import base_task

    if "batch" in wanted:
        return
    from utils.logsafe import mask

    def _send_staged(self: Any, state: Any, tid: str) -> None:
        staged = _staged(state, tid)
        if not staged:
            return
        with self.app.producer_or_acquire() as producer, producer.batch():
            for kid in staged:
                meta = kid["meta"]
                opts: dict[str, Any] = {"task_id": kid["id"],
                                        "argsrepr": repr(mask((kid["params"], meta)))}  # fmt: skip
                if "prio" in meta:
                    opts["priority"] = base_task.broker_priority(meta["prio"])
                if meta.get("queue"):
                    opts["queue"] = meta["queue"]
                self.app.send_task(kid["task"], args=(kid["params"], meta), producer=producer,
                                   **opts)  # fmt: skip
        state.clear_kids(tid)

    base_task.SiteTask._send_staged = _send_staged


class RawPublisher:
    """Children as Celery protocol-2 messages in the kombu Redis transport's format, LPUSHed
    in one pipeline (with the DEL of the staging list) on a redis-py client of the broker."""

    def __init__(self, app: Any) -> None:
        from config import get_settings
        from utils.redis import get_redis

        s = get_settings()
        self.app = app
        self.r = get_redis(s.broker_url)
        opts = app.conf.broker_transport_options or {}
        self.prefix = opts.get("global_keyprefix", "")
        self.sep = opts.get("sep", "\x06\x16")
        self.origin = f"gen{os.getpid()}@bench"
        self._queues: dict[str, str] = {}

    def queue_for(self, task: str) -> str:
        q = self._queues.get(task)
        if q is None:
            from worker import route

            q = self._queues[task] = route(task, (), {}, {})["queue"]
        return q

    def key_and_message(self, kid: dict[str, Any]) -> tuple[str, bytes]:
        import base_task
        from utils.logsafe import mask

        meta = kid["meta"]
        queue = meta.get("queue") or self.queue_for(kid["task"])
        pri = base_task.broker_priority(meta["prio"]) if "prio" in meta else 0
        return self.message(kid["task"], kid["id"], [kid["params"], meta], queue, pri,
                            repr(mask((kid["params"], meta))))  # fmt: skip

    def message(self, task: str, tid: str, args: list[Any], queue: str, pri: int,
                argsrepr: str) -> tuple[str, bytes]:  # fmt: skip
        body = orjson.dumps(
            [args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
        )
        msg = {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {
                "lang": "py",
                "task": task,
                "id": tid,
                "shadow": None,
                "eta": None,
                "expires": None,
                "group": None,
                "group_index": None,
                "retries": 0,
                "timelimit": [None, None],
                "root_id": tid,
                "parent_id": None,
                "argsrepr": argsrepr,
                "kwargsrepr": "{}",
                "origin": self.origin,
                "ignore_result": True,
                "replaced_task_nesting": 0,
                "stamped_headers": None,
                "stamps": {},
            },
            "properties": {
                "correlation_id": tid,
                "reply_to": "",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": pri,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
        key = f"{self.prefix}{queue}{self.sep}{pri}" if pri else f"{self.prefix}{queue}"
        return key, orjson.dumps(msg)

    def send(self, kids: list[dict[str, Any]], staging_key: str) -> None:
        pipe = self.r.pipeline(transaction=False)
        for kid in kids:
            key, msg = self.key_and_message(kid)
            pipe.lpush(key, msg)
        pipe.delete(staging_key)
        pipe.execute()


def _staged(state: Any, tid: str) -> list[dict[str, Any]]:
    """Children staged by this thread's last commit (commitkids), else read back (LRANGE)."""
    raw = getattr(_tls, "kids", None)
    if raw is not None and getattr(_tls, "tid", None) == tid:
        _tls.kids = None
        return [orjson.loads(m) for m in raw]
    return state.staged_kids(tid)


def _p_rawpublish(app: Any, wanted: set[str]) -> None:
    import base_task

    if "batch" in wanted:  # batch publishes its own way
        return

    pub: list[RawPublisher] = []

    def _send_staged(self: Any, state: Any, tid: str) -> None:
        if not pub:
            pub.append(RawPublisher(self.app))
        staged = _staged(state, tid)
        if staged:
            pub[0].send(staged, state.kids_key(tid))

    base_task.SiteTask._send_staged = _send_staged


def _p_evalsha(app: Any, wanted: set[str]) -> None:
    _patch_commit(return_kids=False)


def _p_commitkids(app: Any, wanted: set[str]) -> None:
    if not wanted & {"rawpublish", "batchpublish", "batch"}:
        _p_rawpublish(app, wanted)
    _patch_commit(return_kids=True)


def _patch_commit(return_kids: bool) -> None:
    """RunState.commit as in chains/state.py, but EVALSHA straight into the pipeline (no
    SCRIPT EXISTS per call) and, with `return_kids`, the script returns the staging list."""
    import redis

    import chains.state as st

    script = st._COMMIT
    if return_kids:  # reply: {outstanding tasks of the run, staged child messages...}

        def ret(left: str) -> str:
            return (f"local out = redis.call('LRANGE', KEYS[5], 0, -1); "
                    f"table.insert(out, 1, {left}); return out")  # fmt: skip

        script = script.replace("if run == '' then return 1 end",
                                f"if run == '' then {ret('0')} end")  # fmt: skip
        head, _, tail = script.rpartition("return 1")
        script = head + ret("left") + tail
    shas: dict[int, str] = {}

    def commit(self: Any, *, rid: str, tid: str, step: str, outcome: str, n_items: int,
               entries: Any, kids: Any, pipe_extra: Any = None) -> bool:  # fmt: skip
        args: list[Any] = [tid, rid, step, outcome, n_items, f"{time.time():.3f}", st.RUN_TTL,
                           self.s.key("run", rid, "uniq", ""), len(entries)]  # fmt: skip
        for e in entries:
            args.append(2 * len(e))
            for k, v in e.items():
                args.extend((k, v))
        args.append(len(kids))
        for k in kids:
            args.extend((k.step, k.uniq, k.encode()))
        keys = [
            self.done_key(rid, tid),
            self.counters_key(rid) if rid else self.s.key("norun"),
            self.run_key(rid) if rid else self.s.key("norun"),
            self.outbox_key,
            self.kids_key(tid),
            self.active_key,
            self.pending_key(rid) if rid else self.s.key("norun"),
        ]
        sha = shas.get(id(self.r))
        if sha is None:
            sha = shas[id(self.r)] = self.r.script_load(script)
        for attempt in (0, 1):
            pipe = self.r.pipeline(transaction=False)
            pipe.evalsha(sha, len(keys), *keys, *args)
            if pipe_extra is not None:
                pipe_extra(pipe)
            try:
                res = pipe.execute()[0]
                break
            except redis.exceptions.NoScriptError:
                if attempt:
                    raise
                sha = shas[id(self.r)] = self.r.script_load(script)
        if not return_kids:
            return bool(res)
        if res == 0:
            return False
        _tls.kids, _tls.tid, _tls.outstanding = list(res[1:]), tid, int(res[0])
        return True

    st.RunState.commit = commit


def _p_batch(app: Any, wanted: set[str]) -> None:
    import math

    import base_task

    if "commitkids" not in wanted:
        _patch_commit(return_kids=True)

    size = int(os.environ.get("BENCH_BATCH", "20"))
    backlog = int(os.environ.get("BENCH_BATCH_BACKLOG", "64"))
    pub: list[RawPublisher] = []

    def publish(groups: list[tuple[list[dict[str, Any]], str]]) -> None:
        if not pub:
            pub.append(RawPublisher(app))
        p = pub[0]
        by_dest: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        for staged, _ in groups:
            for kid in staged:
                meta = kid["meta"]
                dest = (kid["task"], meta.get("queue") or p.queue_for(kid["task"]),
                        base_task.broker_priority(meta["prio"]) if "prio" in meta else 0)  # fmt: skip
                by_dest.setdefault(dest, []).append(kid)
        pipe = p.r.pipeline(transaction=False)
        # a shallow backlog (ramp-up, tail): one message per child, every slot gets work;
        # a deep one: full batches (the outstanding count comes back from the commit script)
        deep = getattr(_tls, "outstanding", 0) >= backlog
        for (_task, queue, pri), kids in by_dest.items():
            n_msgs = math.ceil(len(kids) / size) if deep else len(kids)
            per = math.ceil(len(kids) / n_msgs)
            for i in range(0, len(kids), per):
                chunk = kids[i : i + per]
                if len(chunk) == 1:
                    key, msg = p.key_and_message(chunk[0])
                else:
                    key, msg = p.message("chaincrawl.batch", uuid.uuid4().hex, [chunk], queue, pri,
                                         f"[{len(chunk)} x {chunk[0]['task']}]")  # fmt: skip
                pipe.lpush(key, msg)
        keys = [key for staged, key in groups if staged]
        if keys:
            pipe.delete(*keys)
        pipe.execute()

    def _send_staged(self: Any, state: Any, tid: str) -> None:
        staged = _staged(state, tid)
        collecting = getattr(_tls, "collect", None)
        if collecting is not None:
            collecting.append((staged, state.kids_key(tid)))
        elif staged:
            publish([(staged, state.kids_key(tid))])

    base_task.SiteTask._send_staged = _send_staged

    @app.task(name="chaincrawl.batch", bind=True, acks_late=True, ignore_result=True)
    def batch(self: Any, entries: list[dict[str, Any]]) -> str:
        _tls.collect = []
        try:
            for kid in entries:
                task = base_task.get_endpoint(kid["task"]).task
                task.push_request(id=kid["id"], retries=0, hostname=self.request.hostname,
                                  delivery_info=self.request.delivery_info)  # fmt: skip
                try:
                    task.execute(kid["params"], kid["meta"])
                finally:
                    task.pop_request()
        finally:
            groups, _tls.collect = _tls.collect, None
        publish(groups)
        return f"{len(entries)} pages"


def _p_lazyattrs(app: Any, wanted: set[str]) -> None:
    from functools import cached_property

    from external_interface.fetch import Response

    class lazy:
        """Compute once per instance, store in the instance dict; no lock (as in 3.12)."""

        def __init__(self, func: Any, name: str) -> None:
            self.func, self.name = func, name

        def __get__(self, inst: Any, owner: Any = None) -> Any:
            if inst is None:
                return self
            val = inst.__dict__[self.name] = self.func(inst)
            return val

    for name, attr in list(vars(Response).items()):
        if isinstance(attr, cached_property):
            setattr(Response, name, lazy(attr.func, name))


# --- fetch layer --------------------------------------------------------------------------


class Urllib3Fetcher:
    """The fetch contract of external_interface.fetch.RequestsFetcher on urllib3 directly:
    one thread-safe PoolManager, whole-request deadline, size limit, typed errors."""

    def __init__(self, max_redirects: int = 10, pool_size: int = 32) -> None:
        import urllib3

        self.urllib3 = urllib3
        self.max_redirects = max_redirects
        self.pm = urllib3.PoolManager(num_pools=64, maxsize=pool_size, block=False, retries=False)
        self._proxies: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.base_headers = {
            "User-Agent": f"python-urllib3/{urllib3.__version__}",
            "Accept-Encoding": "gzip, deflate",
            "Accept": "*/*",
        }

    def _manager(self, proxy: str | None) -> Any:
        if not proxy:
            return self.pm
        m = self._proxies.get(proxy)
        if m is None:
            with self._lock:
                m = self._proxies.setdefault(proxy, self.urllib3.ProxyManager(proxy, maxsize=8))
        return m

    def fetch(self, req: Any) -> Any:
        from urllib.parse import urlencode

        import exceptions as E
        from external_interface.fetch import Response, _header_charset, _short

        u3 = self.urllib3
        start = time.monotonic()
        deadline = start + req.timeout
        read_timeout = max(0.001, req.timeout)
        url = req.url
        if req.params:
            url += ("&" if "?" in url else "?") + urlencode(req.params, doseq=True)
        headers = {**self.base_headers, **(req.headers or {})}
        if req.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in req.cookies.items())
        body = req.data
        if req.json is not None:
            body = orjson.dumps(req.json)
            headers.setdefault("Content-Type", "application/json")
        elif isinstance(body, dict):
            body = urlencode(body, doseq=True)
            headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        retries = u3.Retry(total=None, connect=0, read=0, status=0, other=0,
                           redirect=self.max_redirects if req.allow_redirects else 0,
                           raise_on_redirect=True)  # fmt: skip
        try:
            resp = self._manager(req.proxy).request(
                req.method, url, body=body, headers=headers, preload_content=False,
                redirect=req.allow_redirects, retries=retries if req.allow_redirects else False,
                timeout=u3.Timeout(connect=min(req.connect_timeout, read_timeout), read=read_timeout),
            )  # fmt: skip
        except u3.exceptions.MaxRetryError as exc:
            reason = exc.reason
            if reason is None or "redirect" in str(exc).lower():
                raise E.TooManyRedirects(
                    f"more than {self.max_redirects} redirects from {req.url}"
                ) from None
            raise self._map(reason, req, E, _short) from None
        except u3.exceptions.HTTPError as exc:
            raise self._map(exc, req, E, _short) from None
        try:
            declared = resp.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > req.max_bytes:
                raise E.ResponseTooLarge(
                    f"{req.url} declares {declared} bytes > limit {req.max_bytes}"
                )
            chunks: list[bytes] = []
            size = 0
            try:
                for chunk in resp.stream(64 * 1024, decode_content=True):
                    size += len(chunk)
                    if size > req.max_bytes:
                        raise E.ResponseTooLarge(
                            f"{req.url} body exceeds limit {req.max_bytes} bytes"
                        )
                    chunks.append(chunk)
                    if time.monotonic() > deadline:
                        raise E.FetchTimeout(
                            f"body of {req.url} not read within {req.timeout:.1f}s"
                        )
            except (E.ResponseTooLarge, E.FetchTimeout):
                raise
            except Exception as exc:
                if "Timeout" in type(exc).__name__:
                    raise E.FetchTimeout(f"read timeout for {req.url}") from None
                raise E.TruncatedResponse(
                    f"body of {req.url} ended early ({type(exc).__name__})"
                ) from None
        finally:
            resp.release_conn()
        history = [h.url for h in (resp.retries.history if resp.retries else ()) if h.url]
        return Response(
            url=_abs(url, resp.url) if resp.url else url,
            status=resp.status,
            headers=resp.headers,
            content=b"".join(chunks),
            elapsed=time.monotonic() - start,
            declared_encoding=_header_charset(resp.headers.get("content-type", "")),
            history=history,
        )

    def _map(self, exc: BaseException, req: Any, E: Any, short: Any) -> Exception:
        u3 = self.urllib3.exceptions
        if isinstance(exc, u3.ProxyError):
            return E.ProxyError(f"proxy failed for {req.url}: {type(exc).__name__}")
        if isinstance(exc, u3.ConnectTimeoutError):
            return E.FetchTimeout(f"connect timeout for {req.url}")
        if isinstance(exc, u3.ReadTimeoutError | u3.TimeoutError):
            return E.FetchTimeout(f"read timeout for {req.url}")
        if isinstance(exc, u3.NewConnectionError | u3.ProtocolError | OSError):
            return E.ConnectError(f"connection failed for {req.url}: {short(exc)}")
        return E.TransportError(f"request failed for {req.url}: {short(exc)}")


def _abs(base: str, url: str | None) -> str:
    from urllib.parse import urljoin

    return urljoin(base, url or "")


def _p_urllib3(app: Any, wanted: set[str]) -> None:
    import base_task
    from config import get_settings

    base_task._fetcher = Urllib3Fetcher(max_redirects=get_settings().max_redirects)
