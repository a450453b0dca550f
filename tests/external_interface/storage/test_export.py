"""Items out of the JSONL store: JSON Lines as stored, CSV with a column per field, the latest
version per key, one run's items, every version, a limit, an unknown type."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import orjson
import pytest

from external_interface.storage.export import cell, export
from external_interface.storage.sinks.base import Origin
from external_interface.storage.sinks.jsonl import JsonlSink
from utils.registry import UnknownNameError

T = "shop.product"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    sink = JsonlSink(tmp_path, fsync=False)
    first = [{"sku": "a", "price": 1.5, "tags": ["x"], "stock": None},
             {"sku": "b", "price": 2, "on_sale": True}]  # fmt: skip
    sink.write(T, ["sku"], first, origins=[Origin("100-0", "r1", "list", "shop.pc.list")] * 2)
    again = [{"sku": "a", "price": 1.25, "tags": ["x", "y"], "note": 'say "hi", bye'}]
    sink.write(T, ["sku"], again, origins=[Origin("200-0", "r2", "list", "shop.pc.list")])
    return tmp_path


def out(item_type: str, root: Path, **kw: object) -> tuple[int, bytes]:
    buf = io.BytesIO()
    n = export(item_type, buf, root=root, **kw)  # type: ignore[arg-type]
    return n, buf.getvalue()


def test_jsonl_is_the_latest_version_per_key(store: Path) -> None:
    n, data = out(T, store)
    assert n == 2
    assert [orjson.loads(x) for x in data.splitlines()] == [
        {"sku": "b", "price": 2, "on_sale": True},
        {"sku": "a", "price": 1.25, "tags": ["x", "y"], "note": 'say "hi", bye'},
    ]
    JsonlSink(store).compact(T)  # compacted: the same items, streamed as stored
    assert out(T, store)[1] == data


def test_a_run_every_version_and_a_limit(store: Path) -> None:
    assert [orjson.loads(x)["sku"] for x in out(T, store, run="r1")[1].splitlines()] == ["a", "b"]
    assert orjson.loads(out(T, store, run="r2")[1]) == {"sku": "a", "price": 1.25,
                                                        "tags": ["x", "y"], "note": 'say "hi", bye'}  # fmt: skip
    assert out(T, store, run="r9") == (0, b"")
    n, data = out(T, store, all_versions=True)
    assert n == 3 and [orjson.loads(x)["price"] for x in data.splitlines()] == [1.5, 2, 1.25]
    assert out(T, store, all_versions=True, run="r2")[0] == 1
    assert out(T, store, limit=1)[0] == 1 and out(T, store, limit=0) == (0, b"")


def test_csv_has_a_column_per_field(store: Path) -> None:
    n, data = out(T, store, fmt="csv")
    rows = list(csv.reader(io.StringIO(data.decode())))
    assert n == 2
    assert rows == [
        ["sku", "price", "on_sale", "tags", "note"],
        ["b", "2", "true", "", ""],
        ["a", "1.25", "", '["x","y"]', 'say "hi", bye'],
    ]
    assert data.count(b"\r\n") == 3  # RFC 4180 line ends
    assert out(T, store, fmt="csv", run="r9") == (0, b"\r\n")  # no rows: an empty header


def test_cells() -> None:
    assert [cell(None), cell("x"), cell(False), cell(3), cell(0.5), cell({"a": [1]})] == [
        "", "x", "false", "3", "0.5", '{"a":[1]}'
    ]  # fmt: skip


def test_unknown_type_and_format(store: Path) -> None:
    with pytest.raises(UnknownNameError, match=r"did you mean 'shop\.product'"):
        out("shop.produkt", store)
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        out(T, store, fmt="xml")
