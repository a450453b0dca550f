"""A finished page's outputs as its commit carries them: outbox entries for the items, and the
child tasks its chain step dispatches (follow-ups of the same step, then each child step's
fan-out from the items), deduplicated across runs where the step asks (`skip_seen_hours`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import orjson

from ledger.model import Chain, fan_out
from ledger.state import Kid
from lifecycle.endpoints import Follow, Item
from lifecycle.runtime import Runtime
from utils.ids import new_id
from utils.wire import DEDUP, OutboxFields, TaskMeta


def outbox_entries(
    rid: str, step: str, task: str, stored: list[tuple[Item, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Outbox entries of the stored items, one per item type; `stored` pairs each item with
    its JSON dump (made once per item for these entries and for the children's fan-out)."""
    by_type: dict[type[Item], list[dict[str, Any]]] = {}
    for it, row in stored:
        by_type.setdefault(type(it), []).append(row)
    return [
        OutboxFields.of(rid, step, task, cls.item_type, cls.key_fields, rows).encode()
        for cls, rows in by_type.items()
    ]


def children(
    rt: Runtime,
    chain: Chain | None,
    task: str,
    meta: TaskMeta,
    items: list[Item],
    follows: list[Follow],
    dumped: list[dict[str, Any]],
    skipped: dict[str, tuple[str, int]] | None = None,
) -> list[Kid]:
    """The tasks a page dispatches: its follow-ups (same step, next page, up to the step's
    `max_pages`), then each child step's tasks from the items that feed it. `skipped` gets
    step id -> (task, n) of the children dropped as crawled before (`skip_seen_hours`)."""
    kids: list[Kid] = []
    step = meta.step
    node = chain.steps.get(step) if chain else None
    max_pages = node.options.max_pages if node else None
    if follows and (max_pages is None or meta.page < max_pages):
        for f in follows:
            nxt = meta.child(step, meta.page + 1)
            nxt.queue = meta.queue  # a follow-up stays where its step sends it
            kids.append(Kid(step, task, f.params, nxt.to_wire(), new_id()))
    if node is None or not node.children:
        return kids
    pairs = [(it.item_type, row) for it, row in zip(items, dumped, strict=True)]
    for child in node.children:
        cmeta = meta.child(child.id)
        if child.options.priority is not None:
            cmeta.priority = child.options.priority
        if child.options.queue:
            cmeta.queue = child.options.queue
        wire = cmeta.to_wire()
        batch = []
        for params in fan_out(child, pairs):
            uniq = fingerprint(params) if child.options.unique else ""
            batch.append(Kid(child.id, child.task, params, dict(wire), new_id(), uniq))
        if child.options.skip_seen_hours is not None and batch:
            n = len(batch)
            batch = skip_seen(rt, child.task, batch, child.options.skip_seen_hours)
            if skipped is not None and len(batch) < n:
                skipped[child.id] = (child.task, n - len(batch))
        kids.extend(batch)
    return kids


def skip_seen(rt: Runtime, task: str, kids: list[Kid], hours: float) -> list[Kid]:
    """Drop children crawled within `hours` (0: ever); the rest carry their dedup id so they
    mark it once they have committed: a request counts as crawled only after its items were
    durably handed off, so a page that failed is crawled again by the next run
    (tests/integration/test_chain_runs.py::test_skip_seen_dedups_requests_across_runs)."""
    ids = [fingerprint(k.params) for k in kids]
    within = timedelta(hours=hours) if hours > 0 else None
    todo = set(rt.request_dedup(task).filter_new(ids, within=within))
    keep = []
    for k, i in zip(kids, ids, strict=True):
        if i in todo:
            k.meta[DEDUP] = i
            keep.append(k)
    return keep


def fingerprint(params: Mapping[str, Any]) -> str:
    """A parameter set's identity (`unique` steps, `skip_seen_hours`): key order ignored."""
    return hashlib.blake2b(
        orjson.dumps(params, option=orjson.OPT_SORT_KEYS), digest_size=12
    ).hexdigest()
