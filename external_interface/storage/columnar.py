"""Items out of the JSONL store as a Parquet dataset, for analysis (`control.sh items TYPE
--format parquet --out DIR`; pyarrow, the `parquet` extra).

    DIR/fetch_day=2026-12-01/part-0-0.parquet     hive partitions by the day items were fetched

Columns: one per top-level field of the items (in first-seen order), then `_run_id` (the run
that stored the item), `_fetched_at` (timestamp, UTC: when the page that yielded it was
fetched and committed, its outbox entry's time) and `_entry`. A column's type is decided over
all items first (bool, int64, float64 when ints and floats mix, string); nested values, and
columns whose items disagree on the type, are JSON text, so every file of the dataset has one
schema. What is exported is what `control.sh items` prints: the latest version per key, one
run's items (`run`), or every stored version (`all_versions`). The store is read twice and
written in chunks: memory holds one chunk, not the store.

DuckDB reads the dataset as it is:

    SELECT fetch_day, count(*) FROM read_parquet('DIR/**/*.parquet', hive_partitioning = true)
    GROUP BY fetch_day
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from exceptions import ConfigError
from external_interface.storage.sinks.history import version_time
from external_interface.storage.sinks.jsonl import (
    Line,
    Snapshot,
    item_types,
    latest_lines,
    open_snapshot,
)
from utils.registry import UnknownNameError

FORMATS = ("parquet",)  # `control.sh items --format`, beside export.FORMATS
PARTITION = "fetch_day"
META_COLUMNS = ("_run_id", "_fetched_at", "_entry")
CHUNK = 50_000


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError as e:  # optional dependency
        raise ConfigError(
            "Parquet export needs pyarrow: pip install -r requirements/parquet.txt"
        ) from e
    return pyarrow


def _lines(snap: Snapshot, run: str | None, all_versions: bool) -> Iterator[Line]:
    if all_versions:
        return (ln for ln in snap.lines() if run is None or ln.run == run)
    return (ln for ln, _ in latest_lines(snap, run))


def _kind(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "json"


def _arrow_type(pa: Any, kinds: set[str]) -> Any:
    kinds = kinds - {""}
    if kinds == {"bool"}:
        return pa.bool_()
    if kinds == {"int"}:
        return pa.int64()
    if kinds and kinds <= {"int", "float"}:
        return pa.float64()
    return pa.string()


def _cell(value: Any, as_text: bool) -> Any:
    if value is None or not as_text or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def export_parquet(
    item_type: str,
    out: Path | str,
    *,
    run: str | None = None,
    all_versions: bool = False,
    root: Path | str | None = None,
) -> int:
    """Write a type's items under `out` (made; an earlier export's partitions there are
    replaced); -> items written. UnknownNameError for a type the store does not hold."""
    pa = _pyarrow()
    import pyarrow.dataset as ds

    out = Path(out)
    if out.exists() and any(p.name.split("=", 1)[0] != PARTITION for p in out.iterdir()):
        raise ConfigError(f"{out} holds files that are not an export's: give an empty directory")
    snap = open_snapshot(item_type, root)
    if snap is None:
        raise UnknownNameError("item type", item_type, item_types(root))
    with snap:
        kinds: dict[str, set[str]] = {}
        n = 0
        for line in _lines(snap, run, all_versions):  # pass 1: the columns and their types
            for k, v in orjson.loads(line.raw).items():
                kinds.setdefault(k, set()).add(_kind(v))
            n += 1
        clash = {PARTITION, *META_COLUMNS} & set(kinds)
        if clash:
            raise ConfigError(f"{item_type}: fields {sorted(clash)} are the export's own columns")
        fields = [(k, _arrow_type(pa, kinds[k])) for k in kinds]
        schema = pa.schema(
            [
                *fields,
                ("_run_id", pa.string()),
                ("_fetched_at", pa.timestamp("ms", tz="UTC")),
                ("_entry", pa.string()),
                (PARTITION, pa.string()),
            ]
        )
        text = {k for k, t in fields if t == pa.string()}
        for old in out.glob(f"{PARTITION}=*"):
            shutil.rmtree(old)
        out.mkdir(parents=True, exist_ok=True)
        chunk: list[dict[str, Any]] = []
        part = 0

        def flush() -> None:
            nonlocal part
            table = pa.Table.from_pylist(chunk, schema=schema)
            ds.write_dataset(
                table,
                out,
                format="parquet",
                basename_template=f"part-{part}-{{i}}.parquet",
                partitioning=ds.partitioning(pa.schema([(PARTITION, pa.string())]), flavor="hive"),
                existing_data_behavior="overwrite_or_ignore",
            )
            part += 1
            chunk.clear()

        for line in _lines(snap, run, all_versions):  # pass 2: the rows
            item = orjson.loads(line.raw)
            at = version_time(line.version)
            row = {k: _cell(item.get(k), k in text) for k in kinds}
            row.update(
                _run_id=line.run,
                _fetched_at=at,
                _entry=line.entry,
                **{PARTITION: at.date().isoformat()},
            )
            chunk.append(row)
            if len(chunk) >= CHUNK:
                flush()
        if chunk:
            flush()
    return n
