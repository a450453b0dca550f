"""The torture suite's machinery: private servers, a fleet of real workers, a killer, checks.

Everything here runs on 127.0.0.0/8 with servers of its own (a private redis-server per test,
never the machine's shared one). Workers are real `celery worker` processes started in their
own process group, so `Worker.kill()` is a SIGKILL of the whole group, as a crash would be.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import redis
from redis.cluster import RedisCluster

from config import DEFAULT_POOL, ROOT, get_settings, reset_settings
from settings.suite import get_suite_settings
from utils import environ
from utils.keyspace import Keyspace
from utils.redis import reset_clients
from utils.servers import RedisServer

# --- the process environment ------------------------------------------------------------------

# the pool of the workers the harness starts: the default pool, or `CHAINCRAWL_TORTURE_POOL=threads
# ./control.sh test -m slow tests/torture` for the long suite on another one
POOL = get_suite_settings().torture_pool or DEFAULT_POOL


def base_env(redis_url: str, var: Path, prefix: str = "tt", **extra: str) -> dict[str, str]:
    """Settings every torture worker (and the test process) runs with; short timeouts so a
    lost worker's messages come back within seconds."""
    env = {
        "CHAINCRAWL_REDIS_URL": redis_url,
        # set explicitly: a BROKER_URL in the caller's environment must not win
        "CHAINCRAWL_BROKER_URL": redis_url,
        "CHAINCRAWL_KEY_PREFIX": prefix,
        "CHAINCRAWL_EXTRA_SITE_PACKAGES": "tests.testsite,tests.torture.site",
        "CHAINCRAWL_VAR_DIR": str(var),
        "CHAINCRAWL_JSONL_DIR": str(var / "items"),
        "CHAINCRAWL_VISIBILITY_TIMEOUT": "8",
        "CHAINCRAWL_RETRY_BACKOFF": "0.2",
        "CHAINCRAWL_RETRY_BACKOFF_MAX": "1",
        "CHAINCRAWL_MAX_RETRIES": "6",
        "CHAINCRAWL_MAX_REDELIVERIES": "3",
        "CHAINCRAWL_SINKS": "jsonl",
        # every write stays in the files: `check_store` sees an entry written twice
        "CHAINCRAWL_JSONL_MODE": "append",
        "CHAINCRAWL_OUTBOX_FLUSH_INTERVAL": "0.1",
        "CHAINCRAWL_OUTBOX_CLAIM_IDLE": "2",
        "CHAINCRAWL_OUTBOX_MAX_BACKOFF": "2",
        # a run with no commit for 3 s is checked for messages the broker lost
        "CHAINCRAWL_SWEEP_STALL": "3",
        "CHAINCRAWL_SWEEP_INTERVAL": "1",
        # a killed worker's messages come back once its heartbeat is 3 s old
        # (broker/owners.py), before the visibility timeout would give them back
        "CHAINCRAWL_DEAD_WORKER_AFTER": "3",
        # the resource providers are tested elsewhere; the torture is about crashes
        "CHAINCRAWL_PROVIDERS": "user_agent=noop,device_id=noop,sign=noop,cookie=noop",
    }
    env.update(extra)
    return env


@contextlib.contextmanager
def process_env(env: Mapping[str, str]) -> Iterator[None]:
    """Point this process (settings, Redis clients, the Celery app) at `env`, then restore."""
    import sites
    import worker

    saved = environ.apply(env)
    _refresh()
    sites.load_all()
    worker.configure(get_settings())
    try:
        yield
    finally:
        environ.restore(saved)
        _refresh()
        worker.configure(get_settings())


def _refresh() -> None:
    reset_settings()  # a new settings object: a new runtime (providers, chains, run state)
    reset_clients()


# --- workers ------------------------------------------------------------------------------------


class Worker:
    """One real `celery worker` process; its log file tells when it is ready."""

    def __init__(
        self,
        env: Mapping[str, str],
        log: Path,
        name: str,
        *,
        pool: str = "",
        concurrency: int = 8,
        queues: str = "demo",
        loglevel: str = "INFO",
    ) -> None:
        self.log = log
        self.name = name
        pool = pool or POOL
        cmd = [
            sys.executable, "-m", "celery", "-A", "worker", "worker",
            "-P", pool, "-c", str(concurrency), "-Q", queues, "-n", f"{name}@%h",
            "--without-gossip", "--without-mingle", "-E", "-l", loglevel,
        ]  # fmt: skip
        self.fh = open(log, "wb")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env={**os.environ, **env}, stdout=self.fh, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.started = time.monotonic()
        self.killed = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self) -> bool:
        try:
            return b" ready." in self.log.read_bytes()
        except OSError:
            return False

    def wait_ready(self, timeout: float = 90) -> Worker:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return self
            if not self.alive():
                raise RuntimeError(f"worker {self.name} exited {self.proc.returncode}:\n"
                                   f"{self.text()[-3000:]}")  # fmt: skip
            time.sleep(0.1)
        raise TimeoutError(f"worker {self.name} not ready in {timeout}s:\n{self.text()[-3000:]}")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole process group (prefork children too): no cleanup runs."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.killed = True
        self.fh.close()

    def stop(self, timeout: float = 30) -> None:
        """Warm shutdown (SIGTERM): the drainer flushes; SIGKILL if it hangs."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stray prefork children
        self.fh.close()


class Fleet:
    """A set of workers with the same options; keeps `size` of them running if supervised."""

    def __init__(
        self, env: Mapping[str, str], logdir: Path, tag: str = "w", **options: Any
    ) -> None:
        self.env = dict(env)
        self.logdir = logdir
        self.tag = tag
        self.options = options
        self.workers: list[Worker] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None
        self.restarts = 0
        self.deaths: list[tuple[str, int | None]] = []  # (name, returncode) of unplanned exits

    def spawn(self) -> Worker:
        with self._lock:
            n = len(self.workers)
            name = f"{self.tag}{n}"
            w = Worker(self.env, self.logdir / f"{name}.log", name, **self.options)
            self.workers.append(w)
            return w

    def start(self, n: int, wait: bool = True) -> list[Worker]:
        ws = [self.spawn() for _ in range(n)]
        if wait:
            for w in ws:
                w.wait_ready()
        return ws

    def alive(self) -> list[Worker]:
        with self._lock:
            return [w for w in self.workers if w.alive()]

    def ready(self) -> list[Worker]:
        return [w for w in self.alive() if w.ready()]

    def supervise(self, size: int, poll: float = 0.2) -> None:
        """Replace workers that die on their own (a task that kills its worker)."""

        def loop() -> None:
            while not self._stop.wait(poll):
                with self._lock:
                    dead = [w for w in self.workers if not w.alive() and not w.killed
                            and not getattr(w, "_mourned", False)]  # fmt: skip
                    for w in dead:
                        w._mourned = True  # type: ignore[attr-defined]
                        self.deaths.append((w.name, w.proc.returncode))
                if len(self.alive()) < size:
                    self.spawn()
                    self.restarts += 1

        self._supervisor = threading.Thread(target=loop, name="fleet-supervisor", daemon=True)
        self._supervisor.start()

    def logs(self) -> dict[str, str]:
        return {w.log.name: w.text() for w in self.workers}

    def stop(self) -> None:
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(5)
        for w in list(self.workers):
            w.stop()


class Killer(threading.Thread):
    """SIGKILLs a random worker every `interval` seconds (uniform) and starts a replacement."""

    def __init__(
        self, fleet: Fleet, interval: tuple[float, float] = (2.0, 5.0), seed: int | None = None
    ) -> None:
        super().__init__(name="killer", daemon=True)
        self.fleet = fleet
        self.interval = interval
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.kills = 0
        self.kills_busy = 0  # victims that were ready (had been taking tasks) when killed
        self.timeline: list[tuple[float, str, bool]] = []
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop_event.wait(self.rng.uniform(*self.interval)):
            alive = self.fleet.alive()
            if not alive:
                continue
            victim = self.rng.choice(alive)
            was_ready = victim.ready()
            victim.kill()
            self.kills += 1
            self.kills_busy += int(was_ready)
            self.timeline.append((round(time.monotonic() - self.t0, 2), victim.name, was_ready))
            self.fleet.spawn()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(10)


# --- servers -------------------------------------------------------------------------------------


def restart_redis(server: RedisServer, how: str = "term", down_for: float = 2.0) -> float:
    """Stop the server (SIGTERM: it writes the AOF out; SIGKILL: no goodbye), keep it down for
    `down_for` seconds, start it again on the same port and dir. -> seconds it was down."""
    t0 = time.monotonic()
    if how == "kill":
        server.kill()
    else:
        server.stop()
    time.sleep(down_for)
    server.start(timeout=30)
    return time.monotonic() - t0


# --- watching a run -----------------------------------------------------------------------------


def counters(r: redis.Redis | RedisCluster, prefix: str, rid: str) -> dict[str, int]:
    raw = cast("dict[bytes, bytes]", r.hgetall(Keyspace(prefix).counters(rid)))
    return {k.decode(): int(v) for k, v in raw.items()}


def wait_complete(
    handle: Any,
    timeout: float,
    poll: float = 0.5,
    on_poll: Callable[[Any], None] | None = None,
    progress_log: Path | None = None,
) -> Any:
    """`RunHandle.wait` that rides out Redis being unreachable for a while; with
    `progress_log`, appends the totals there every few seconds (to watch a long run)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    next_log = 0.0
    while time.monotonic() < deadline:
        try:
            p = handle.progress()
        except redis.RedisError:
            time.sleep(poll)
            continue
        last = p
        if progress_log is not None and time.monotonic() >= next_log:
            next_log = time.monotonic() + 5
            with open(progress_log, "a") as f:
                f.write(f"{time.strftime('%H:%M:%S')} outstanding={p.outstanding} {p.totals}\n")
        if on_poll is not None:
            on_poll(p)
        if p.complete:
            return p
        time.sleep(poll)
    raise TimeoutError(
        f"run {handle.run_id} not complete after {timeout}s: "
        + (f"{last.outstanding} outstanding, totals {last.totals}" if last else "no progress read")
    )


def wait_for(cond: Callable[[], bool], timeout: float, poll: float = 0.1, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except redis.RedisError:
            pass
        time.sleep(poll)
    raise TimeoutError(f"not within {timeout}s: {what}")


# --- checking the store -------------------------------------------------------------------------


@dataclass
class TypeCheck:
    item_type: str
    expected: int
    stored_unique: int = 0  # read_items: keys present (latest version each)
    raw_records: int = 0  # committed JSONL lines of the run
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    dup_keys: list[str] = field(default_factory=list)  # a key stored by two different entries
    rewrites: int = 0  # one (key, entry) pair written more than once


@dataclass
class StoreReport:
    types: list[TypeCheck]

    @property
    def items_checked(self) -> int:
        return sum(t.stored_unique for t in self.types)

    @property
    def duplicates(self) -> int:
        return self.dup_keys + self.rewrites

    @property
    def dup_keys(self) -> int:
        """Keys stored by two different entries: a task committed twice. Never expected."""
        return sum(len(t.dup_keys) for t in self.types)

    @property
    def rewrites(self) -> int:
        """(key, entry) pairs written more than once (the drainer wrote an entry twice)."""
        return sum(t.rewrites for t in self.types)

    @property
    def missing(self) -> int:
        return sum(len(t.missing) for t in self.types)

    def summary(self) -> dict[str, Any]:
        return {
            "items_checked": self.items_checked,
            "raw_records": sum(t.raw_records for t in self.types),
            "missing": self.missing,
            "duplicates": self.duplicates,
            "dup_keys": self.dup_keys,
            "rewrites": self.rewrites,
            "by_type": {
                t.item_type: {
                    "expected": t.expected,
                    "stored": t.stored_unique,
                    "raw": t.raw_records,
                    "missing": t.missing[:5],
                    "unexpected": t.unexpected[:5],
                    "dup_keys": t.dup_keys[:5],
                    "rewrites": t.rewrites,
                }
                for t in self.types
            },
        }


def demo_expected_ids(exp: Mapping[str, Any]) -> dict[str, tuple[str, set[str]]]:
    """item type -> (key field, every id the demo site has)."""
    return {
        "demo.user": ("user_id", {f"u{i}" for i in range(1, exp["users"] + 1)}),
        "demo.post": ("post_id", {f"p{i}" for i in range(1, exp["posts"] + 1)}),
        "demo.comment": ("comment_id", {f"c{i}" for i in range(1, exp["comments"] + 1)}),
    }


def check_store(
    root: Path, expected: Mapping[str, tuple[str, set[str]]], run_id: str | None = None
) -> StoreReport:
    """Compare the JSONL store with the expected ids, exactly once:

    - `read_items` (latest version per key) holds every expected id and nothing else;
    - no key was stored by two different outbox entries (a task committed twice);
    - no (key, entry) pair was written twice (the sink repeated a redelivered entry).
    """
    from external_interface.storage.sinks.jsonl import iter_records, read_items

    out = []
    for item_type, (key, ids) in expected.items():
        t = TypeCheck(item_type, len(ids))
        latest = {str(i[key]) for i in read_items(item_type, root)}
        t.stored_unique = len(latest)
        t.missing = sorted(ids - latest)
        t.unexpected = sorted(latest - ids)
        entries: dict[str, set[str]] = {}
        pairs: Counter[tuple[str, str]] = Counter()
        for rec in iter_records(item_type, root):
            if run_id is not None and rec.get("run") != run_id:
                continue
            t.raw_records += 1
            k = str(rec["item"][key])
            entries.setdefault(k, set()).add(rec.get("entry") or "")
            pairs[(k, rec.get("entry") or "")] += 1
        t.dup_keys = sorted(k for k, es in entries.items() if len(es) > 1)
        t.rewrites = sum(n - 1 for n in pairs.values() if n > 1)
        out.append(t)
    return StoreReport(out)


def scan_values(r: redis.Redis | RedisCluster, match: str) -> Iterable[tuple[str, bytes]]:
    """(key, value) for every string/list/hash/stream value under `match` (for secret scans)."""
    for key in r.scan_iter(match=match, count=500):
        kind = r.type(key)
        name = key.decode(errors="replace")
        if kind == b"string":
            v = cast("bytes | None", r.get(key))
            if v is not None:
                yield name, v
        elif kind == b"list":
            for v in cast("list[bytes]", r.lrange(key, 0, -1)):
                yield name, v
        elif kind == b"hash":
            for f, v in cast("dict[bytes, bytes]", r.hgetall(key)).items():
                yield name, f + b"=" + v
        elif kind == b"set":
            for v in cast("set[bytes]", r.smembers(key)):
                yield name, v
        elif kind == b"zset":
            for v in cast("list[bytes]", r.zrange(key, 0, -1)):
                yield name, v
        elif kind == b"stream":
            for _id, fields in cast(
                "list[tuple[bytes, dict[bytes, bytes]]]", r.xrange(key, "-", "+")
            ):
                for f, v in fields.items():
                    yield name, f + b"=" + v


def redelivered(r: redis.Redis | RedisCluster, prefix: str, settle: float = 3.0) -> int:
    """Task attempts that were delivered more than once (their first worker died), from the
    endpoints' `redelivered` metric (delivery counters go with their commits); `settle`: time
    for the live workers' metric aggregators to flush."""
    time.sleep(settle)
    return sum(int(r.hget(k, "redelivered") or 0)
               for k in r.scan_iter(match=f"{prefix}:metrics:task:*", count=1000))  # fmt: skip


# --- broken guarantees and lost broker messages (docs/reliability.md) --------------------------


class BrokenGuarantee(AssertionError):
    """A torture run broke a guarantee listed in docs/reliability.md (each is also shown on
    its own in test_crash_paths.py). Raised only after every other check passed, so the
    report names every other problem first."""


class RewrittenEntries(BrokenGuarantee):
    """One outbox entry written twice to the JSONL store (same key, same entry)."""


def raise_broken_guarantees(resender: Any = None, store: StoreReport | None = None) -> None:
    """Raise one BrokenGuarantee naming every guarantee that was broken, if any was.

    Messages the broker lost are no longer one: chaincrawl's sweeper re-sends them
    (`resender` only reports how many, see `SweeperWatch`)."""
    found: list[BrokenGuarantee] = []
    if store is not None and store.rewrites:
        found.append(RewrittenEntries(f"{store.rewrites} item(s) written twice by one entry"))
    if len(found) == 1:
        raise found[0]
    if found:
        raise BrokenGuarantee(" | ".join(f"{type(e).__name__}: {e}" for e in found))


class SentLedger(threading.Thread):
    """Every `task-sent` event (workers and clients publish one per message they send):
    task id -> (task name, args repr, retries, queue), when the workers send task events
    (`CHAINCRAWL_TASK_EVENTS`): what a torture run checks the broker against (re-sending
    what the broker lost is the run ledger's and sweeper's job, chains/sweeper.py)."""

    def __init__(self, url: str, prefix: str) -> None:
        super().__init__(name="sent-ledger", daemon=True)
        self.client = redis.Redis.from_url(url)
        self.pattern = f"{prefix}:q:*celeryev/task.sent"
        self.sent: dict[str, tuple[str, str, int, str]] = {}
        self._stop_event = threading.Event()
        self._ready = threading.Event()

    def run(self) -> None:
        import base64
        import json

        ps = None
        while not self._stop_event.is_set():
            try:
                if ps is None:
                    ps = self.client.pubsub(ignore_subscribe_messages=True)
                    ps.psubscribe(self.pattern)
                    self._ready.set()
                m = ps.get_message(timeout=0.5)
            except redis.RedisError:  # Redis restarted: subscribe again
                with contextlib.suppress(Exception):
                    ps.close()  # type: ignore[union-attr]
                ps = None
                time.sleep(0.5)
                continue
            if not m:
                continue
            try:
                body = json.loads(base64.b64decode(json.loads(m["data"])["body"]))
            except (ValueError, KeyError, TypeError):
                continue
            uuid_ = body.get("uuid")
            if not uuid_:
                continue
            prev = self.sent.get(uuid_)
            retries = int(body.get("retries") or 0)
            if prev is None or retries >= prev[2]:
                self.sent[uuid_] = (body["name"], body["args"], retries, body.get("queue") or "")

    def start(self) -> SentLedger:  # type: ignore[override]
        super().start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


class SweeperWatch:
    """Watches a run (`wait_complete(on_poll=...)`) for what chaincrawl's sweeper re-sent: the
    messages the broker lost (chains/sweeper.py), from the run's `resent` counter. The
    test re-sends nothing itself: a loss the sweeper missed leaves the run incomplete."""

    def __init__(self, ledger: SentLedger | None = None, prefix: str = "", **_: Any) -> None:
        self.ledger = ledger
        self.prefix = prefix
        self.resent = 0

    def __call__(self, p: Any) -> None:
        self.resent = max(self.resent, int(p.totals.get("resent", 0)))

    @property
    def losses(self) -> int:
        """Messages the broker lost and the sweeper re-sent (each one counted once)."""
        return self.resent

    def describe(self) -> str:
        return f"{self.resent} task message(s) lost by the broker and re-sent by the sweeper"


Resender = SweeperWatch  # the name the crash tortures used when the test re-sent by itself


def sweeper_resends(logs: Iterable[str]) -> list[str]:
    """Task ids the sweeper re-sent, from the workers' logs (chains/sweeper.py logs each)."""
    import re

    pat = re.compile(r"task (\w+) \([^)]*\) lost by the broker; re-sent")
    return [tid for text in logs for tid in pat.findall(text)]
