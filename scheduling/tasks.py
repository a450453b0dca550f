"""The beat task: start a schedule entry's chain run unless its previous run is still going.

An entry's record names its latest run; its lock is held while one trigger decides, so
concurrent triggers (a redelivery, two beats by mistake) cannot both start a run (both keys:
docs/scheduling.md).

"Still going" = the run id is in `runs:active` and its record says `running`; a run older
than the entry's `stale_after` no longer blocks (its lost messages would block forever).

An entry scheduled by change (`by_change:`) starts a run of the keys its change model says are
due, within its budget, at every tick; runs of one entry may overlap (a key sent is not due
again until it is stored or RETRY_AFTER passed: scheduling/recrawl/history.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import requests
from celery import shared_task

import chains
from chains import Chain, step
from config import get_settings
from exceptions import ChainCrawlError
from ledger.state import RunState
from scheduling.limits import effective_limits
from scheduling.periodic import TRIGGER_TASK, ScheduleEntry
from scheduling.recrawl import History, Watch, recrawl_clock
from utils.lua import load_lua
from utils.redis import as_str, get_redis

log = logging.getLogger("chaincrawl.schedule")

LOCK_MS = 30_000
_UNLOCK = load_lua(__file__, "trigger_unlock.lua")


@dataclass
class Outcome:
    status: str  # started | running | skipped
    run_id: str = ""
    reason: str = ""

    def __str__(self) -> str:
        tail = f" ({self.reason})" if self.reason else ""
        return f"{self.status} {self.run_id}".rstrip() + tail


def entry_key(name: str) -> str:
    return get_settings().key("sched", name)


def _reachable(url: str, timeout: float = 3.0) -> bool:
    """Any HTTP answer counts: the point is that something is listening."""
    try:
        with requests.get(url, timeout=timeout, stream=True, allow_redirects=False):
            return True
    except requests.RequestException:
        return False


def trigger(entry: ScheduleEntry) -> Outcome:
    """Start `entry`'s chain unless its last run is still going; never raises for a skip."""
    r = get_redis()
    state = RunState(r)
    key = entry_key(entry.name)
    token = uuid.uuid4().hex
    if not r.set(f"{key}:lock", token, nx=True, px=LOCK_MS):
        return _note(
            r, entry.name, Outcome("running", reason="another trigger of this entry is deciding")
        )
    try:
        if entry.by_change is not None:
            return _note(r, entry.name, _trigger_by_change(r, entry))
        current = as_str(r.hget(key, "run"))
        if current and r.sismember(state.active_key, current):
            info = state.info(current)
            age = time.time() - float(info.get("created") or 0)
            stale = entry.stale_seconds
            if info.get("status") == "running" and (stale is None or age < stale):
                return _note(r, entry.name, Outcome("running", current, f"started {age:.0f}s ago"))
            if info.get("status") == "running":
                log.warning(
                    "schedule %s: run %s is %.0fs old (stale_after %s); starting anew",
                    entry.name,
                    current,
                    age,
                    entry.stale_after,
                )
        if entry.only_if_reachable and not _reachable(entry.only_if_reachable):
            return _note(
                r, entry.name, Outcome("skipped", reason=f"{entry.only_if_reachable} not reachable")
            )
        try:
            handle = chains.run(target_chain(entry), seeds=entry.seeds, priority=entry.priority)
        except ChainCrawlError as exc:  # unknown chain, bad seeds: a config problem, not a crash
            log.error("schedule %s: cannot start chain %s: %s", entry.name, entry.target, exc)
            return _note(r, entry.name, Outcome("skipped", reason=f"{type(exc).__name__}: {exc}"))
        r.hset(
            key,
            mapping={"run": handle.run_id, "chain": entry.target, "started": f"{time.time():.3f}"},
        )
        log.info("schedule %s: started run %s of %s", entry.name, handle.run_id, entry.target)
        return _note(r, entry.name, Outcome("started", handle.run_id))
    finally:
        r.eval(_UNLOCK, 1, f"{key}:lock", token)


def target_chain(entry: ScheduleEntry) -> str | Chain:
    """The chain an entry starts: its `chain` by name, or its one `step` as a chain of its own."""
    if entry.chain is not None:
        return entry.chain
    return Chain(entry.name, step(entry.target))


def watch_of(entry: ScheduleEntry) -> Watch:
    """The watched set of a `by_change` entry: its site is the site of the step it starts."""
    assert entry.by_change is not None
    b = entry.by_change
    root = chains.get_chain(entry.chain).root.task if entry.chain else entry.target
    return Watch(
        name=entry.name,
        site=root.split(".", 1)[0],
        item_type=b.item,
        key=b.key,
        param=b.param or b.key,
        fields=tuple(b.fields),
        knobs=b.knobs(),
    )


def _trigger_by_change(r: Any, entry: ScheduleEntry) -> Outcome:
    """One tick of a `by_change` entry: the keys due now within its budget, as one run."""
    try:
        watch = watch_of(entry)
        ch = target_chain(entry)
    except ChainCrawlError as exc:
        log.error("schedule %s: cannot start %s: %s", entry.name, entry.target, exc)
        return Outcome("skipped", reason=f"{type(exc).__name__}: {exc}")
    history = History(r, get_settings().key_prefix, watch)
    history.publish()
    sent, dropped = history.dispatch(recrawl_clock(r).now())
    if dropped:
        log.info(
            "schedule %s: %d keys dropped (sent %d times, never stored): %s",
            entry.name,
            len(dropped),
            len(dropped),
            ", ".join(dropped[:5]),
        )
    if not sent:
        return Outcome("skipped", reason="no key due")
    try:
        handle = chains.run(ch, seeds=[{watch.param: k} for k in sent], priority=entry.priority)
    except ChainCrawlError as exc:
        log.error("schedule %s: cannot start %s: %s", entry.name, entry.target, exc)
        return Outcome("skipped", reason=f"{type(exc).__name__}: {exc}")
    r.hset(
        entry_key(entry.name),
        mapping={"run": handle.run_id, "chain": entry.target, "started": f"{time.time():.3f}"},
    )
    log.info("schedule %s: %d keys due, run %s", entry.name, len(sent), handle.run_id)
    return Outcome("started", handle.run_id, f"{len(sent)} keys due")


def _note(r: Any, name: str, outcome: Outcome) -> Outcome:
    fields = {"last_check": f"{time.time():.3f}", "last_outcome": str(outcome)}
    r.hset(entry_key(name), mapping=fields)
    if outcome.status != "started":
        log.info("schedule %s: %s", name, outcome)
    return outcome


def check_limits() -> None:
    """Fail at worker start, not in every task, when CHAINCRAWL_LIMITS or
    CHAINCRAWL_DEFAULT_LIMITS is malformed."""
    effective_limits()


check_limits()  # the worker imports this module: a bad setting stops the worker at once


@shared_task(name=TRIGGER_TASK, ignore_result=True, acks_late=False)
def trigger_chain(entry: str, spec: dict[str, Any]) -> str:
    """Sent by beat for each tick of a schedule entry (args: its name and its settings)."""
    return str(trigger(ScheduleEntry.model_validate({**spec, "name": entry})))
