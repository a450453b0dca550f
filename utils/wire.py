"""The wire formats Python and the Lua scripts share: one definition each, encoded and decoded
here and nowhere else.

- `TaskMeta`: what a task message carries besides its parameters (its run, step, priority
  and retry state), in a compact wire form with short keys, table below: every page's
  message, ledger entry and staged child holds one, and the ledger's Lua scripts read `step`.
- `TaskEnvelope`: a task message as the ledger, the staging lists, the waiting list, the
  batch task and the dead-letter replay carry it, `{"id":"<id>","task":...,"params":...,
  "meta":...}`. `id` comes first: ledger/commit.lua and chains' scripts read a message's id
  by its prefix `{"id":"` without decoding it.
- `OutboxFields`: the fields of one outbox stream entry (run, step, task, type, key, items,
  and dedup when given), as the commit script writes them and the drainer reads them.
- `CommitArgs` / `commit_argv`: one task's part of the commit script's ARGV, and the whole
  ARGV of one script call for several commits of one run, laid out as ledger/commit.lua's
  header comment says (tests/utils/test_wire.py holds the exact layout).

The layer of this module is the bottom one (utils), so the ledger, the outbox drainer and the
clients all build the same bytes.

The meta's wire keys:

    wire key    field         meaning
    run         run_id        the run the task belongs to ("" = a task sent outside a run)
    step        step          the chain step that dispatched it (counters are kept per step)
    prio        priority      0..9, 9 most urgent (the run's, or the step's override)
    page        page          1 for a step's first task, n for its (n-1)th follow-up
    queue       queue         the step's queue override ("" = the site's queue)
    dd          dedup_id      the request's dedup id, marked once the task has committed
    rbase       retry_base    retries already used before the task was parked (a paused run)
    waits       waits         re-queues spent waiting for a resource or a shared limit
    wait_since  wait_since    when it started waiting (unix time) for `resource_wait_max`
    avoid       avoid         resource leases that failed it ("kind:id"): a retry skips them
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

RUN, STEP, PRIORITY, PAGE, QUEUE = "run", "step", "prio", "page", "queue"
DEDUP, RETRY_BASE, WAITS, WAIT_SINCE, AVOID = "dd", "rbase", "waits", "wait_since", "avoid"

AVOID_KEEP = 32  # leases a message remembers to avoid (the newest)


@dataclass(slots=True)
class TaskMeta:
    run_id: str = ""
    step: str = ""
    priority: int | None = None
    page: int = 1
    queue: str = ""
    dedup_id: str = ""
    retry_base: int = 0
    waits: int = 0
    wait_since: float | None = None
    avoid: tuple[str, ...] = ()

    @classmethod
    def from_wire(cls, d: Mapping[str, Any] | None) -> TaskMeta:
        """Tolerant of what a hand-made or old message may lack; a malformed priority is
        dropped (the default applies) rather than failing the page."""
        if not d:
            return cls()
        prio = d.get(PRIORITY)
        try:
            prio = None if prio is None else int(prio)
        except (TypeError, ValueError):
            prio = None
        since = d.get(WAIT_SINCE)
        return cls(
            run_id=str(d.get(RUN) or ""),
            step=str(d.get(STEP) or ""),
            priority=prio,
            page=int(d.get(PAGE) or 1),
            queue=str(d.get(QUEUE) or ""),
            dedup_id=str(d.get(DEDUP) or ""),
            retry_base=int(d.get(RETRY_BASE) or 0),
            waits=int(d.get(WAITS) or 0),
            wait_since=float(since) if since else None,
            avoid=tuple(d.get(AVOID) or ()),
        )

    def to_wire(self) -> dict[str, Any]:
        """The compact form, with unset fields left out (as the messages always were)."""
        d: dict[str, Any] = {}
        if self.run_id:
            d[RUN] = self.run_id
        if self.step:
            d[STEP] = self.step
        if self.priority is not None:
            d[PRIORITY] = self.priority
        if self.page != 1:
            d[PAGE] = self.page
        if self.queue:
            d[QUEUE] = self.queue
        if self.dedup_id:
            d[DEDUP] = self.dedup_id
        if self.retry_base:
            d[RETRY_BASE] = self.retry_base
        if self.waits:
            d[WAITS] = self.waits
        if self.wait_since is not None:
            d[WAIT_SINCE] = self.wait_since
        if self.avoid:
            d[AVOID] = list(self.avoid)
        return d

    def child(self, step: str, page: int = 1) -> TaskMeta:
        """A child's metadata: its run and priority kept, everything per-attempt reset."""
        return TaskMeta(run_id=self.run_id, step=step, priority=self.priority, page=page)


ID_PREFIX = b'{"id":"'  # what the Lua side matches to read a message's id without decoding


class WireError(ValueError):
    """A message that is not the format it claims to be."""


def dumps(value: Any) -> bytes:
    """JSON as every reader of these formats expects it (orjson's defaults: string keys)."""
    return orjson.dumps(value)


class TaskEnvelope(NamedTuple):
    """One task message: its id, task name, parameters and meta (`TaskMeta`'s wire
    form)."""

    id: str
    task: str
    params: dict[str, Any]
    meta: dict[str, Any]

    def encode(self) -> bytes:
        return orjson.dumps(
            {"id": self.id, "task": self.task, "params": self.params, "meta": self.meta}
        )

    def to_dict(self) -> dict[str, Any]:
        """The decoded dict form (a batch entry, `RunState.staged_kids`)."""
        return {"id": self.id, "task": self.task, "params": self.params, "meta": self.meta}

    @classmethod
    def decode(cls, raw: bytes | str) -> TaskEnvelope:
        try:
            d = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise WireError(f"task message is not JSON: {exc}") from None
        if not isinstance(d, dict):
            raise WireError(f"task message must be a JSON object, got {type(d).__name__}")
        return cls.from_dict(d, strict=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], strict: bool = False) -> TaskEnvelope:
        """From the dict form. `strict`: a missing or mistyped field is a `WireError`; else
        what cannot be read is left empty (a message from a foreign client still fails
        visibly, without its run if its meta is unreadable)."""
        tid, task = d.get("id"), d.get("task")
        params, meta = d.get("params"), d.get("meta")
        if strict:
            for name, v, t in (
                ("id", tid, str),
                ("task", task, str),
                ("params", params, dict),
                ("meta", meta, dict),
            ):
                if not isinstance(v, t):
                    raise WireError(f"task message field {name!r} must be {t.__name__}, got {v!r}")
        return cls(
            str(tid or ""),
            str(task or ""),
            params if isinstance(params, dict) else {},
            meta if isinstance(meta, dict) else {},
        )


def envelope_id(raw: bytes) -> str:
    """A message's id as the Lua scripts read it: by its prefix, else decoded."""
    if raw.startswith(ID_PREFIX):
        end = raw.find(b'"', len(ID_PREFIX))
        if end > 0:
            return raw[len(ID_PREFIX) : end].decode()
    return TaskEnvelope.decode(raw).id


OUTBOX_FIELDS = ("run", "step", "task", "type", "key", "items", "dedup")


@dataclass(frozen=True)
class OutboxFields:
    """One outbox entry: the items of one item type of one task (`items` a JSON array of the
    rows, `key` a JSON array of the key field names, `dedup` JSON when given)."""

    run: str
    step: str
    task: str
    type: str
    key: bytes
    items: bytes
    dedup: bytes | None = None

    @classmethod
    def of(
        cls,
        run: str,
        step: str,
        task: str,
        type: str,
        key_fields: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
        dedup: Any = None,
    ) -> OutboxFields:
        return cls(
            run or "",
            step or "",
            task,
            type,
            dumps(list(key_fields)),
            dumps(list(rows)),
            None if dedup is None else dumps(dedup),
        )

    def encode(self) -> dict[str, str | bytes]:
        """The stream entry's fields, in the order the drainer lists them."""
        f: dict[str, str | bytes] = {
            "run": self.run,
            "step": self.step,
            "task": self.task,
            "type": self.type,
            "key": self.key,
            "items": self.items,
        }
        if self.dedup is not None:
            f["dedup"] = self.dedup
        return f


class KidArgs(NamedTuple):
    """A child a commit stages: its step, its `unique` fingerprint ("" if none), its message."""

    step: str
    uniq: str
    msg: bytes


class CommitArgs(NamedTuple):
    """One task's commit as the script reads it (ledger/commit.lua's ARGV, per commit)."""

    tid: str
    step: str
    outcome: str
    n_items: int
    kids: tuple[KidArgs, ...] = ()
    counts: tuple[tuple[str, str, int], ...] = ()  # (step, counter, n), n != 0


def commit_argv(
    run: str,
    now: str,
    ttl: int,
    uniq_prefix: str,
    commits: Sequence[tuple[CommitArgs, Sequence[Mapping[str, Any]]]],
) -> list[Any]:
    """The ARGV of one commit script call: `commits` pairs each commit with its outbox
    entries (`OutboxFields.encode()` form). Entries alike but for their items share a group:
    the script merges the fresh commits' items of a group into one stream entry. An entry
    whose items are not a JSON array is its own `r` group, written as it came."""
    groups: dict[Any, int] = {}
    header: list[Any] = []
    body: list[Any] = []
    for c, entries in commits:
        body += (c.step, c.outcome, c.n_items, len(entries))
        for e in entries:
            items = e.get("items")
            if isinstance(items, str):
                items = items.encode()
            if isinstance(items, bytes) and items[:1] == b"[" and items[-1:] == b"]":
                fields = tuple((k, v) for k, v in e.items() if k != "items")
                g = groups.get(fields)
                if g is None:
                    g = groups[fields] = len(groups) + 1
                    header += ("m", 2 * len(fields), *(x for kv in fields for x in kv))
                body += (g, items[1:-1])
            else:  # not a JSON array: written as it came (the drainer dead-letters it)
                g = groups[object()] = len(groups) + 1
                header += ("r", 2 * len(e), *(x for kv in e.items() for x in kv))
                body += (g, "")
        body.append(len(c.kids))
        for k in c.kids:
            body += k
        body.append(len(c.counts))
        for cnt in c.counts:
            body += cnt
    return [
        run,
        now,
        ttl,
        uniq_prefix,
        len(commits),
        len(groups),
        *(c.tid for c, _ in commits),
        *header,
        *body,
    ]


__all__ = [
    "AVOID",
    "AVOID_KEEP",
    "DEDUP",
    "ID_PREFIX",
    "OUTBOX_FIELDS",
    "PAGE",
    "PRIORITY",
    "QUEUE",
    "RETRY_BASE",
    "RUN",
    "STEP",
    "WAITS",
    "WAIT_SINCE",
    "CommitArgs",
    "KidArgs",
    "OutboxFields",
    "TaskEnvelope",
    "TaskMeta",
    "WireError",
    "commit_argv",
    "dumps",
    "envelope_id",
]
