"""`control.sh items TYPE` beyond the JSONL files: `--history` (the versions of an item's
history fields, from a sink that keeps them), `--search` (full text, from the postgres sink),
`--format parquet --out DIR` (a dataset for analysis).

The item types' declarations (`history_fields`, `search_fields`) are read from the site
modules, as the workers read them, plus the environment (CHAINCRAWL_TRACK_HISTORY, ...).
Output: JSON lines (one version or item a line); to a terminal, history is a table too.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

import sites
from cli import UserError
from config import get_settings
from exceptions import ConfigError
from external_interface.storage.columnar import export_parquet
from external_interface.storage.routing import Sink, sink_registry, split_names, type_policies
from external_interface.storage.sinks.base import SinkError
from external_interface.storage.sinks.history import Version
from utils.registry import UnknownNameError

HISTORY_SINKS = ("postgres", "mongo", "jsonl")  # the sinks that keep field history


def _policies() -> Any:
    sites.load_all()  # the Item classes declare their history and search fields
    return type_policies.copy().update_from_env()


def _sink(name: str) -> Sink:
    settings = get_settings()
    try:
        factory = sink_registry.get(name)
        return factory(settings, _policies())
    except (UnknownNameError, ConfigError) as e:
        raise UserError(f"--from {name}: {e}") from None


def history_sink_name(item_type: str, chosen: str | None) -> str:
    """The sink `--history` reads: `--from`, else the first of the type's sinks that keeps
    history (its route, else CHAINCRAWL_SINKS)."""
    if chosen:
        if chosen not in HISTORY_SINKS:
            raise UserError(
                f"--from {chosen}: keeps no history (sinks that do: {', '.join(HISTORY_SINKS)})"
            )
        return chosen
    routed = _policies().for_type(item_type).sinks or split_names(get_settings().sinks)
    for name in routed:
        if name in HISTORY_SINKS:
            return name
    raise UserError(f"{item_type} goes to {', '.join(routed)}: none keeps history (--from)")


def history(item_type: str, key: Sequence[str] | None, chosen: str | None) -> int:
    if not key:
        raise UserError("--history needs the item's key: --key VALUE (once per key field)")
    name = history_sink_name(item_type, chosen)
    sink = _sink(name)
    try:
        found: list[Version] = sink.history(item_type, list(key))  # type: ignore[attr-defined]
    except (SinkError, ConfigError) as e:
        raise UserError(str(e)) from None
    finally:
        sink.close()
    if not found:
        print(
            f"no history of {item_type} {list(key)} in {name} (is the key right, and does the "
            "type declare history_fields?)",
            file=sys.stderr,
        )
        return 0
    if sys.stdout.isatty():
        _table(found, name)
    else:
        for v in found:
            sys.stdout.buffer.write(orjson.dumps(v.as_dict()) + b"\n")
    return 0


def _table(found: list[Version], name: str) -> None:
    t = Table(title=f"history of {list(found[0].key)} ({name})")
    for col in ("field", "value", "valid from", "valid to"):
        t.add_column(col)
    for v in found:
        t.add_row(
            v.field,
            orjson.dumps(v.value).decode(),
            v.valid_from.isoformat(),
            v.valid_to.isoformat() if v.valid_to else "(current)",
        )
    Console().print(t)


def search(item_type: str, words: str, chosen: str | None, limit: int | None) -> int:
    name = chosen or "postgres"
    sink = _sink(name)
    if not hasattr(sink, "search"):
        raise UserError(f"--from {name}: has no search (the postgres sink has)")
    try:
        found = sink.search(item_type, words, limit=limit or 20)
    except (SinkError, ConfigError) as e:
        raise UserError(str(e)) from None
    finally:
        sink.close()
    for item in found:
        sys.stdout.buffer.write(orjson.dumps(item) + b"\n")
    if not found:
        print(f"no {item_type} item matches {words!r}", file=sys.stderr)
    return 0


def parquet(item_type: str, out: str | None, run_id: str | None, all_versions: bool) -> int:
    if not out:
        raise UserError("--format parquet writes a dataset: give its directory with --out DIR")
    try:
        n = export_parquet(item_type, out, run=run_id, all_versions=all_versions)
    except ConfigError as e:
        raise UserError(str(e)) from None
    print(f"wrote {n} {item_type} item(s) to {out} (partitioned by fetch_day)", file=sys.stderr)
    return 0
