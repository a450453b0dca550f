"""What a worker process keeps between pages, in one object built when the process starts.

Building a fetcher, a provider, a run-state client (it hashes its Lua scripts) or a publisher
costs far more than a page can afford, and some answers (a run's chain, whether it is paused)
are read once a second instead of once a page. All of it lives in one `Runtime`: the worker
builds it at start with its pool size (`install`), every page reaches it through `current()`,
and a test that changes the settings gets a fresh one by itself (the runtime is rebuilt when
the settings object or the process changes), instead of resetting a dozen module caches.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from config import Settings, get_settings
from external_interface.dedup import RedisDedup
from external_interface.resources.base import Provider, load_providers, provider_name, providers
from ledger.model import Chain, chain_from_dict
from ledger.publish import BATCH_CPU_MIN, Load, Publisher, batch_size
from ledger.state import RunState
from lifecycle.endpoints import BROWSER, EndpointSpec, queue_for
from utils.modules import load_object
from utils.process import RankedSlots, gevent_patched, pid
from utils.redis import get_redis
from utils.wire import PRIORITY

if TYPE_CHECKING:
    from external_interface.fetch import Fetcher
    from external_interface.fetch.robots import RobotsPolicy

PROVIDER_ORDER = ("proxy", "device_id", "user_agent", "cookie", "sign")
CHAINS_KEPT = 256  # parsed chain definitions of recent runs
# The fetch stack is a plugin loaded by path when the process first fetches: a process that
# only starts runs (a triggering script) imports no fetcher, pycurl or parsel.
FETCHER = "external_interface.fetch.select:settings_fetcher"
ROBOTS = "external_interface.fetch.robots:settings_policy"
RUNS_SEEN_KEPT = 1024  # runs whose outstanding count this process remembers
HOLD_TTL = 1.0  # seconds a run's cancelled/paused answer is reused


class Runtime:
    """One worker process's long-lived state (see the module docstring)."""

    def __init__(self, settings: Settings | None = None, slots: int = 0) -> None:
        self.settings = settings or get_settings()
        self.pid = os.getpid()
        self.slots = slots
        self.load = Load(slots)
        self.local = threading.local()  # greenlet-local under gevent: the batch a page is in
        self._lock = threading.Lock()
        self._page_slots: RankedSlots | None = None
        self._fetcher: Fetcher | None = None
        self._robots: RobotsPolicy | None = None
        self._providers: dict[tuple[str, str, str], Provider] = {}
        self._plans: dict[str, list[tuple[str, str]]] = {}
        self._loggers: dict[str, logging.Logger] = {}
        self._states: dict[int, RunState] = {}
        self._chains: OrderedDict[str, Chain] = OrderedDict()
        self._outstanding: dict[str, int] = {}
        self._publishers: dict[int, Publisher] = {}
        self._holds: dict[str, tuple[float, str]] = {}
        self._dedup: dict[str, RedisDedup] = {}

    # -- fetching

    def fetcher(self) -> Fetcher:
        """The fetch layer, behind the development HTTP cache when `CHAINCRAWL_HTTP_CACHE` is
        set (never consulted otherwise)."""
        if self._fetcher is None:
            self._fetcher = load_object(FETCHER)(self.settings)
        return self._fetcher

    def robots(self) -> RobotsPolicy | None:
        """robots.txt for every origin this process fetches from (None when turned off)."""
        if self._robots is None and self.settings.robots:
            with self._lock:
                if self._robots is None:
                    self._robots = load_object(ROBOTS)(self.fetcher(), self.settings)
        return self._robots

    def provider(self, name: str, site: str, platform: str) -> Provider:
        key = (name, site, platform)
        p = self._providers.get(key)
        if p is None:
            with self._lock:
                p = self._providers.get(key)
                if p is None:
                    if name not in providers:
                        load_providers()
                    p = self._providers[key] = providers.get(name)(site, platform)
        return p

    def resource_plan(self, spec: EndpointSpec) -> list[tuple[str, str]]:
        """(kind, provider name) in the order providers must run: proxy first, sign last.
        Computed once per endpoint: every page asks."""
        plan = self._plans.get(spec.name)
        if plan is None:
            s = self.settings
            wanted = {k: n for k, n in spec.resources.items() if k != BROWSER}  # not a provider
            if spec.site in {x.strip() for x in s.proxy_sites.split(",")}:
                wanted.setdefault("proxy", "proxy")
            plan = [(k, provider_name(spec.site, k, n, s.providers)) for k, n in wanted.items()]
            order = {k: i for i, k in enumerate(PROVIDER_ORDER)}
            plan = self._plans[spec.name] = sorted(plan, key=lambda kn: order.get(kn[0], 99))
        return plan

    def logger(self, name: str) -> logging.Logger:
        """`logging.getLogger` takes the logging module's lock: once per endpoint, not per page."""
        lg = self._loggers.get(name)
        if lg is None:
            lg = self._loggers[name] = logging.getLogger(f"chaincrawl.site.{name}")
        return lg

    # -- the run ledger

    def state(self, client: Any = None) -> RunState:
        """The run-state client of a Redis client (the state store's by default)."""
        client = client if client is not None else get_redis(self.settings.redis_url)
        st = self._states.get(id(client))
        if st is None:
            st = self._states[id(client)] = RunState(client, self.settings)
        return st

    def chain(self, state: RunState, rid: str) -> Chain | None:
        """The chain run `rid` runs, parsed once per process (its definition never changes).
        A known run is read without the lock (every page asks; under gevent the lock is
        Python code): each OrderedDict operation is atomic under the GIL, and a run evicted
        between the read and the move keeps the chain it was found with."""
        ch = self._chains.get(rid)
        if ch is not None:
            with contextlib.suppress(KeyError):  # evicted between the two: still its chain
                self._chains.move_to_end(rid)
            return ch
        raw = state.chain_def(rid)
        if raw is None:
            return None
        ch = chain_from_dict(orjson.loads(raw))
        with self._lock:
            self._chains[rid] = ch
            while len(self._chains) > CHAINS_KEPT:
                self._chains.popitem(last=False)
        return ch

    def hold(self, state: RunState, rid: str) -> str:
        """Whether run `rid` is cancelled or paused (`RunState.hold`), read at most once a
        second per process: a batch's pages all begin when the batch does, and those still
        waiting for a slot when the run is cancelled or paused should not be fetched."""
        now = time.monotonic()
        seen = self._holds.get(rid)
        if seen is not None and now - seen[0] < HOLD_TTL:
            return seen[1]
        # one reader per second: the other greenlets and threads keep the last answer meanwhile
        self.note_hold(rid, seen[1] if seen is not None else "", now)
        hold = state.hold(rid)
        self.note_hold(rid, hold)
        return hold

    def known_hold(self, rid: str) -> str | None:
        """Run `rid`'s hold ("cancelled", "paused" or "") as this process read it within
        HOLD_TTL seconds (a begin's read, `hold`, or the reply of a commit of the run, which
        reads it anyway); None: not that lately. A begin that knows it reads nothing: a
        cancel or pause reaches the process's next begins with its next commit of the run,
        at most HOLD_TTL later (the commit script itself reads it at every commit)."""
        seen = self._holds.get(rid)
        if seen is not None and time.monotonic() - seen[0] < HOLD_TTL:
            return seen[1]
        return None

    def note_hold(self, rid: str, hold: str, at: float | None = None) -> None:
        """Run `rid`'s hold as just read (by a begin, a commit's script)."""
        if len(self._holds) > 10_000:  # old runs: forget them all, the next read costs one call
            self._holds.clear()
        self._holds[rid] = (time.monotonic() if at is None else at, hold)

    def note_outstanding(self, rid: str, n: int) -> None:
        if len(self._outstanding) > RUNS_SEEN_KEPT:
            self._outstanding.clear()
        self._outstanding[rid] = n

    def outstanding_seen(self, rid: str) -> int | None:
        """The run's outstanding count at this process's last commit (None: not seen yet)."""
        return self._outstanding.get(rid) if rid else 0

    def unbatch(self, rid: str) -> bool:
        """Whether a running batch should hand its pages not started to messages of their own:
        the run's backlog, as this process last saw it, is too shallow for batches
        (`batch_size` would publish one page per message now: the run's tail). The CPU share
        is not asked: mid-run, a slot busy with a batch leaves the others their work, and
        splitting every batch a quiet 0.1 s window finds cost 10-15 % more CPU per page."""
        seen = self._outstanding.get(rid) if rid else None
        if seen is None or self.settings.batch <= 1:
            return False
        return batch_size(self.settings, seen, self.load, cpu_floor=False) == 1

    def send_kids_now(self, rid: str) -> bool:
        """Whether a page of a batch message that has children commits and sends them at once
        instead of with the batch's last page. Yes while its run is in its tail (or not seen
        yet) or the worker wants less than 3/4 of a core: the next hop is the run's critical
        path, and in a small crawl or a latency-bound one a catalog page's children waited for
        the slowest page of its batch (one waiting for a page slot: a latency more) for one
        commit round trip saved. A CPU-bound worker deep in a run keeps the one commit."""
        seen = self.outstanding_seen(rid)
        if seen is None or seen < self.load.tail_backlog():
            return True
        return self.load.busy() < BATCH_CPU_MIN

    def publisher(self, app: Any) -> Publisher:
        p = self._publishers.get(id(app))
        if p is None:
            p = self._publishers[id(app)] = Publisher(app, self.settings, queue_for, self.load)
        return p

    def request_dedup(self, task: str) -> RedisDedup:
        """The dedup store of a task's requests (namespace `req:<task>`, `skip_seen_hours`)."""
        store = self._dedup.get(task)
        if store is None:
            store = self._dedup[task] = RedisDedup(
                f"req:{task}", get_redis(self.settings.redis_url)
            )
        return store

    # -- page slots

    def page_slots(self) -> RankedSlots | None:
        """Under gevent, the worker's slots, which every page holds while it runs, as a message
        of its own or as a batch entry: a batch runs its entries side by side (each one waits
        for a slot), so a worker never has more pages in progress, or requests in flight, than
        its concurrency, however its pages are packed into messages. The slots go to the most
        urgent waiting page first (`page_rank`). None on the threads and prefork pools, which
        run a batch's entries one after the other."""
        if self._page_slots is None and gevent_patched():
            self._page_slots = RankedSlots(self.load.slots)
        return self._page_slots

    def page_rank(self, meta: Mapping[str, Any] | None) -> int:
        """A page's claim on a slot: its run's priority (0..9, 9 most urgent; the default
        where a message carries none or a malformed one, which must not keep it from running)."""
        try:
            return int((meta or {})[PRIORITY])
        except (KeyError, TypeError, ValueError):
            return self.settings.default_priority

    def holding(self, meta: Mapping[str, Any] | None) -> contextlib.AbstractContextManager[Any]:
        """`with rt.holding(meta):` holds a page slot where there are page slots."""
        slots = self.page_slots()
        return slots.slot(self.page_rank(meta)) if slots is not None else contextlib.nullcontext()


_current: Runtime | None = None
_install_lock = threading.Lock()


def current() -> Runtime:
    """This process's runtime; a new one (same slots) when the settings object or the process
    changed since it was built (tests that point the settings elsewhere, a forked child)."""
    rt = _current
    if rt is not None and rt.settings is get_settings() and rt.pid == pid():
        return rt
    with _install_lock:
        rt = _current
        if rt is None or rt.settings is not get_settings() or rt.pid != pid():
            rt = install(Runtime(get_settings(), rt.slots if rt is not None else 0))
    return rt


def install(rt: Runtime) -> Runtime:
    """Make `rt` the process's runtime (the worker does, once it knows its pool size)."""
    global _current
    _current = rt
    return rt


@contextlib.contextmanager
def using(rt: Runtime) -> Iterator[Runtime]:
    """Run with `rt` as the runtime, then put the previous one back (tests)."""
    global _current
    before = _current
    _current = rt
    try:
        yield rt
    finally:
        _current = before


REQUEUE_PAUSE = 1.0  # seconds a slot waits before requeueing a message it could not run


def pause_before_requeue() -> None:
    """With the state store down and the broker elsewhere (RabbitMQ, another Redis), a requeued
    message comes straight back: without a pause every slot would spin through the queue,
    logging a warning per delivery, until Redis returns."""
    time.sleep(REQUEUE_PAUSE)
