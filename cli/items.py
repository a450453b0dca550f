"""`control.sh items [TYPE]`: stored items as JSON lines or CSV, to stdout or a file (history,
search and Parquet: cli/itemviews.py).

Without TYPE: the types the JSONL store holds, with their counts and files. Output to a pipe
that closes early (`| head`) ends quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from cli import UserError, itemviews
from external_interface.storage.export import FORMATS, export
from external_interface.storage.sinks.jsonl import (
    default_root,
    item_types,
    open_snapshot,
    read_items,
    type_files,
)
from settings.storage import get_storage_settings
from utils.registry import UnknownNameError


def run(
    item_type: str | None,
    *,
    fmt: str = "jsonl",
    run_id: str | None = None,
    out: str | None = None,
    all_versions: bool = False,
    limit: int | None = None,
) -> int:
    """The command; -> exit status. Raises UserError for an unknown type or a bad option."""
    if item_type is None:
        return list_types()
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if limit is not None and limit < 0:
        raise UserError(f"--limit must be 0 or more, got {limit}")
    try:
        with _target(out) as stream:
            n = export(
                item_type, stream, fmt=fmt, run=run_id, all_versions=all_versions, limit=limit
            )
            if n == 0 and run_id and limit != 0:
                _no_items_of_run(item_type, run_id)  # raises: --out is not written
    except UnknownNameError as exc:
        raise UserError(f"{exc} in the JSONL store at {default_root()}") from None
    except BrokenPipeError:  # the reader stopped reading (`| head`): that is not an error
        _silence_stdout()
        return 0
    what = f"{n} {item_type} item(s)" + (f" of run {run_id}" if run_id else "")
    if out:
        print(f"wrote {what} to {out}", file=sys.stderr)
    elif n == 0:
        print(f"no {what.split(' ', 1)[1]}", file=sys.stderr)
    return 0


# what `--out FILE`'s extension says the format is (Parquet: a directory, see itemviews)
EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}


def output_format(fmt: str | None, out: str | None) -> str:
    """The format: --format, else the extension of --out, else JSON lines (stdout). An
    extension that names no format, or another format than --format, is refused: `-o x.csv`
    holding JSON lines is a file every spreadsheet misreads."""
    if not out:
        return fmt or "jsonl"
    ext = Path(out).suffix.lower()
    said = EXTENSIONS.get(ext)
    if fmt is None:
        if said is None:
            known = ", ".join(EXTENSIONS)
            raise UserError(
                f"--out {out}: the extension {ext or '(none)'!r} names no format "
                f"({known}); give --format jsonl, csv or parquet"
            )
        return said
    if said is not None and said != fmt:
        raise UserError(f"--out {out} says {said} but --format says {fmt}: make them agree")
    return fmt


def _no_items_of_run(item_type: str, run_id: str) -> None:
    """--run matched nothing: say whether that run stored other types or nothing at all."""
    root = default_root()
    others = []
    for t in item_types(root):
        snap = open_snapshot(t, root)
        if snap is None:
            continue
        with snap:
            if any(line.run == run_id for line in snap.lines()):
                others.append(t)
    if others:
        raise UserError(
            f"run {run_id} stored no {item_type} items (it stored {', '.join(others)})", exit_code=1
        )
    replaced = (
        "; or later runs stored the same keys again: CHAINCRAWL_JSONL_MODE=latest keeps the "
        "latest version of a key only (append keeps every run's)"
        if get_storage_settings().jsonl_mode == "latest"
        else ""
    )
    raise UserError(
        f"run {run_id} stored no items in the JSONL store at {root}: a mistyped "
        f"run id? (./control.sh runs lists the runs){replaced}"
    )


@contextlib.contextmanager
def _target(out: str | None) -> Iterator[BinaryIO]:
    """stdout, or FILE written under a temporary name and renamed when complete."""
    if not out:
        yield sys.stdout.buffer
        return
    path = Path(out)
    if not path.parent.is_dir():
        raise UserError(f"--out {out}: there is no directory {path.parent}")
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def list_types() -> int:
    root = default_root()
    types = item_types(root)
    if not types:
        print(f"the JSONL store at {root} holds no items yet", file=sys.stderr)
        return 0
    try:
        for t in types:
            files = ", ".join(str(p) for p in type_files(t, root)) or "(no items)"
            print(f"{t}\t{len(read_items(t, root))}\t{files}")
    except BrokenPipeError:
        _silence_stdout()
    return 0


def main(a: argparse.Namespace) -> int:
    fmt = output_format(a.format, a.out) if a.type is not None else "jsonl"
    if a.type is not None and (a.history or a.search is not None or fmt == "parquet"):
        try:
            if a.history:
                return itemviews.history(a.type, a.key, a.sink)
            if a.search is not None:
                return itemviews.search(a.type, a.search, a.sink, a.limit)
            return itemviews.parquet(a.type, a.out, a.run, a.all)
        except UnknownNameError as exc:
            raise UserError(f"{exc} in the JSONL store at {default_root()}") from None
    return run(a.type, fmt=fmt, run_id=a.run, out=a.out, all_versions=a.all, limit=a.limit)
