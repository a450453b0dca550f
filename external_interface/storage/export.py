"""Items out of the JSONL store, as JSON Lines or CSV (`control.sh items`).

What is exported: the latest version of each key (what `read_items` returns), in stored order;
with `run`, the items that run stored (the latest version of each key among its lines); with
`all_versions`, every stored line (an append-mode store's history). JSON Lines are the stored
bytes as they are. CSV has one column per top-level field, in the order the fields first
appear; nested values are written as JSON, null as an empty cell, booleans as true/false.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from external_interface.storage.sinks.jsonl import Snapshot, item_types, latest_lines, open_snapshot
from utils.registry import UnknownNameError

FORMATS = ("jsonl", "csv")


def export(
    item_type: str,
    out: BinaryIO,
    *,
    fmt: str = "jsonl",
    run: str | None = None,
    all_versions: bool = False,
    limit: int | None = None,
    root: Path | str | None = None,
) -> int:
    """Write a type's items to `out` (a binary stream); -> items written.

    Raises UnknownNameError (with a "did you mean") when the store has no such type."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
    snap = open_snapshot(item_type, root)
    if snap is None:
        raise UnknownNameError("item type", item_type, item_types(root))
    with snap:
        if fmt == "jsonl":
            return _jsonl(_rows(snap, run, all_versions, limit), out)
        return _csv(snap, run, all_versions, limit, out)


def _rows(
    snap: Snapshot, run: str | None, all_versions: bool, limit: int | None
) -> Iterator[bytes]:
    """The stored lines to export (re-iterable: each call reads the snapshot again)."""
    if all_versions:
        rows: Iterator[bytes] = (ln.raw for ln in snap.lines() if run is None or ln.run == run)
    elif snap.clean and run is None:  # compacted: one line per key already, streamed
        rows = snap.raw_lines()
    else:
        rows = (ln.raw for ln, _ in latest_lines(snap, run))
    for n, raw in enumerate(rows):
        if limit is not None and n >= limit:
            return
        yield raw


def _jsonl(rows: Iterator[bytes], out: BinaryIO) -> int:
    n = 0
    for raw in rows:
        out.write(raw + b"\n")
        n += 1
    out.flush()
    return n


def _csv(
    snap: Snapshot, run: str | None, all_versions: bool, limit: int | None, out: BinaryIO
) -> int:
    columns: dict[str, None] = {}
    for raw in _rows(snap, run, all_versions, limit):
        columns.update(dict.fromkeys(orjson.loads(raw)))
    text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
    try:
        writer = csv.writer(text)
        writer.writerow(columns)
        n = 0
        for raw in _rows(snap, run, all_versions, limit):
            item = orjson.loads(raw)
            writer.writerow([cell(item.get(c)) for c in columns])
            n += 1
        text.flush()
    finally:
        text.detach()  # `out` stays open: it belongs to the caller
    return n


def cell(value: Any) -> str:
    """One CSV cell: text as is, null empty, booleans and numbers as JSON writes them,
    objects and lists as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()
