"""Parquet exports: a dataset partitioned by fetch day, with the run id and fetch time as
columns, one schema across its files, read back by DuckDB (or pyarrow's dataset reader)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from exceptions import ConfigError
from external_interface.storage.columnar import export_parquet
from external_interface.storage.sinks.base import Origin
from external_interface.storage.sinks.jsonl import JsonlSink
from utils.registry import UnknownNameError

pa = pytest.importorskip(
    "pyarrow", reason="Parquet export needs pyarrow (requirements/parquet.txt)"
)
import pyarrow.dataset as ds  # noqa: E402

T = "demo.post"
DAY1 = "1700000000000-0"  # 2023-11-14 22:13:20 UTC
DAY2 = "1700100000000-0"  # 2023-11-16 02:00:00 UTC


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "items"
    s = JsonlSink(root, fsync=False)
    s.write(T, ["post_id"], [{"post_id": "p1", "likes": 1, "score": 2, "tags": ["a"]},
                             {"post_id": "p2", "likes": 2, "score": 2.5, "extra": {"x": 1}}],
            origins=[Origin(DAY1, "r1", "feed", "demo.h5.feed")] * 2)  # fmt: skip
    s.write(T, ["post_id"], [{"post_id": "p3", "likes": 3, "score": 1, "flag": True}],
            origins=[Origin(DAY2, "r2", "feed", "demo.h5.feed")])  # fmt: skip
    s.write(T, ["post_id"], [{"post_id": "p1", "likes": 10, "score": 3}],
            origins=[Origin(DAY2[:-1] + "1", "r2", "feed", "demo.h5.feed")])  # fmt: skip
    return root


def test_partitioned_by_day_with_run_and_fetch_time(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert export_parquet(T, out, root=store) == 3  # the latest version per key
    assert sorted(p.name for p in out.iterdir()) == ["fetch_day=2023-11-14", "fetch_day=2023-11-16"]
    table = ds.dataset(out, format="parquet", partitioning="hive").to_table()
    rows = {r["post_id"]: r for r in table.to_pylist()}
    assert rows["p1"]["likes"] == 10 and rows["p1"]["_run_id"] == "r2"
    assert rows["p1"]["_fetched_at"] == datetime(2023, 11, 16, 2, 0, tzinfo=UTC)
    assert rows["p2"]["fetch_day"] == "2023-11-14" and rows["p2"]["extra"] == '{"x":1}'
    assert rows["p3"]["flag"] is True and rows["p2"]["flag"] is None
    types = {f.name: str(f.type) for f in table.schema}
    assert types["likes"] == "int64" and types["score"] == "double"  # ints and floats: double
    assert types["extra"] == "string" and types["_fetched_at"] == "timestamp[ms, tz=UTC]"
    # one run's items; every version; an export again replaces the earlier one
    assert export_parquet(T, out, root=store, run="r1") == 2  # what r1 stored, p1 then
    assert export_parquet(T, out, root=store, all_versions=True) == 4
    assert ds.dataset(out, partitioning="hive").count_rows() == 4


def test_duckdb_queries_the_dataset(store: Path, tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed")
    out = tmp_path / "out"
    export_parquet(T, out, root=store)
    # the query docs/storage.md shows
    got = duckdb.sql(
        f"SELECT fetch_day, count(*) AS items, sum(likes) AS likes "
        f"FROM read_parquet('{out}/**/*.parquet', hive_partitioning = true) "
        f"GROUP BY fetch_day ORDER BY fetch_day"
    ).fetchall()
    assert [(str(d), n, likes) for d, n, likes in got] == [
        ("2023-11-14", 1, 2),
        ("2023-11-16", 2, 13),
    ]


def test_refusals(store: Path, tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError):
        export_parquet("demo.nope", tmp_path / "o", root=store)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not an export's"):
        export_parquet(T, tmp_path / "busy", root=store)
    assert (tmp_path / "busy" / "notes.txt").exists()
