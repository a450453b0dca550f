"""The MongoDB sink against a real wire-protocol server (MONGO_URL, else a local nx-27017)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pymongo
import pytest

from external_interface.storage.sinks.base import (
    Origin,
    PermanentSinkError,
    Policies,
    SinkError,
    entry_version,
)
from external_interface.storage.sinks.history import version_time
from external_interface.storage.sinks.mongo import MongoSink, collection_name
from tests.external_interface.mongo_server import mongo_db, mongo_url  # noqa: F401 - fixtures
from utils.servers import free_port

T = "demo.post"


@pytest.fixture
def sink(mongo_url: str, mongo_db: str) -> Iterator[MongoSink]:  # noqa: F811
    policies = Policies()
    policies.set(T, track=("likes", "stats.views"), history_limit=3)
    s = MongoSink(mongo_url, mongo_db, policies=policies, timeout=5.0)
    try:
        yield s
    finally:
        s.close()


def o(entry: str) -> Origin:
    return Origin(entry, "r1", "feed", "demo.h5.feed")


def found(doc: dict[str, Any] | None) -> dict[str, Any]:
    """A document find_one is expected to find."""
    assert doc is not None
    return doc


def docs(sink: MongoSink, item_type: str = T) -> list[dict]:
    return list(sink.collection(item_type).find({}, {"_id": 0}).sort("post_id", 1))


def test_upsert_by_key_never_duplicates(sink: MongoSink) -> None:
    items = [{"post_id": i, "likes": i} for i in range(5)]
    sink.write(T, ["post_id"], items, origins=[o("100-0")] * 5)
    sink.write(T, ["post_id"], items, origins=[o("100-0")] * 5)  # redelivered entry
    sink.write(T, ["post_id"], items)  # and once more without any origin
    got = docs(sink)
    assert [d["post_id"] for d in got] == list(range(5))
    assert (
        got[0]["_entry"] == "100-0" and got[0]["_run"] == "r1" and got[0]["_task"] == "demo.h5.feed"
    )
    assert sink.collection(T).name == collection_name(T) == "demo_post"
    # the same key twice inside one batch: the later entry wins
    sink.write(T, ["post_id"], [{"post_id": 9, "likes": 2}, {"post_id": 9, "likes": 1}],
               origins=[o("300-0"), o("200-0")])  # fmt: skip
    assert found(sink.collection(T).find_one({"post_id": 9}))["likes"] == 2
    assert sink.collection(T).count_documents({}) == 6


def test_unique_index_on_key_fields(sink: MongoSink) -> None:
    sink.write("demo.comment", ["post_id", "cid"], [{"post_id": 1, "cid": "a", "t": "x"}])
    sink.write("demo.comment", ["post_id", "cid"], [{"post_id": 1, "cid": "b", "t": "y"}])
    sink.write("demo.comment", ["post_id", "cid"], [{"post_id": 1, "cid": "a", "t": "z"}])
    coll = sink.collection("demo.comment")
    unique = [ix for ix in coll.list_indexes() if ix.get("unique")]
    assert [list(ix["key"].items()) for ix in unique] == [[("post_id", 1), ("cid", 1)]]
    assert coll.count_documents({}) == 2
    with pytest.raises(pymongo.errors.DuplicateKeyError):
        coll.insert_one({"post_id": 1, "cid": "a"})


def test_hostile_field_names_are_sanitised(sink: MongoSink) -> None:
    item = {
        "post_id": 1,
        "$where": "sleep(10000)",
        "a.b": 1,
        "attrs": {"$gt": "", "x.y": {"$ne": [{"$in.z": 1}]}},
    }
    sink.write(T, ["post_id"], [item], origins=[o("100-0")])
    (doc,) = docs(sink)
    assert doc["＄where"] == "sleep(10000)" and doc["a．b"] == 1  # noqa: RUF001
    assert doc["attrs"] == {"＄gt": "", "x．y": {"＄ne": [{"＄in．z": 1}]}}  # noqa: RUF001
    assert "$where" not in doc and "a" not in doc
    # a key *value* shaped like an operator never reaches a query: keys must be scalars
    with pytest.raises(PermanentSinkError):
        sink.write(T, ["post_id"], [{"post_id": {"$ne": None}, "likes": 0}], origins=[o("101-0")])
    assert sink.collection(T).count_documents({}) == 1
    assert found(sink.collection(T).find_one({"post_id": 1}))["＄where"] == "sleep(10000)"  # noqa: RUF001


def test_history_of_tracked_fields(sink: MongoSink) -> None:
    def write(entry: str, likes: int, views: int | None = None) -> None:
        item = {"post_id": 7, "likes": likes, "title": "t"}
        if views is not None:
            item["stats"] = {"views": views}
        sink.write(T, ["post_id"], [item], origins=[o(entry)])

    write("100-0", 1, 10)
    write("200-0", 5, 10)
    write("200-0", 5, 10)  # redelivery: no new history
    write("150-0", 3, 99)  # older entry arriving late: ignored
    write("300-0", 5, 11)
    doc = found(sink.collection(T).find_one({"post_id": 7}))
    assert doc["likes"] == 5 and doc["stats"] == {"views": 11}
    seen = [(h["field"], h["value"], h["entry"]) for h in doc["_history"]]
    assert seen == [("likes", 1, "100-0"), ("stats.views", 10, "100-0"), ("likes", 5, "200-0"),
                    ("stats.views", 11, "300-0")]  # fmt: skip
    assert doc["_history"][2]["at"] == version_time(entry_version("200-0"))  # the entry's time
    for i in range(5):  # history keeps the newest `history_limit` observations of each field
        write(f"{400 + i}-0", 10 + i)
    doc = found(sink.collection(T).find_one({"post_id": 7}))
    assert [h["value"] for h in doc["_history"] if h["field"] == "likes"] == [12, 13, 14]
    assert [h["value"] for h in doc["_history"] if h["field"] == "stats.views"] == [10, 11]
    assert doc["_rev"] == 8 and isinstance(doc["_created_at"].year, int)


def test_a_field_changed_three_times_reads_back_as_three_versions(sink: MongoSink) -> None:
    entries = ["1700000000000-0", "1700000060000-0", "1700000120000-0", "1700000180000-0"]
    for entry, likes in zip(entries, (3, 5, 5, 8), strict=True):  # 5 twice: no new version
        sink.write(T, ["post_id"], [{"post_id": "p1", "likes": likes}], origins=[o(entry)])
    got = [v for v in sink.history(T, ["p1"]) if v.field == "likes"]
    t0 = version_time(entry_version(entries[0]))
    assert [(v.value, v.valid_from - t0, v.valid_to and v.valid_to - t0) for v in got] == [
        (3, timedelta(0), timedelta(minutes=1)),
        (5, timedelta(minutes=1), timedelta(minutes=3)),
        (8, timedelta(minutes=3), None),
    ]
    # a numeric key given as text (the command line) finds the document
    sink.write(T, ["post_id"], [{"post_id": 42, "likes": 1}], origins=[o(entries[0])])
    assert [v.value for v in sink.history(T, ["42"])] == [1]


def test_history_in_the_earlier_layout_is_read_and_continued(sink: MongoSink) -> None:
    created = datetime(2023, 1, 1, tzinfo=UTC)
    changed = datetime(2023, 1, 2, tzinfo=UTC)
    sink.collection(T).insert_one({
        "post_id": "old", "likes": 2, "_v": 5, "_rev": 1, "_created_at": created,
        "_history": [{"field": "likes", "old": 1, "new": 2, "at": changed, "entry": "5-0"}],
    })  # fmt: skip
    sink.write(T, ["post_id"], [{"post_id": "old", "likes": 3}], origins=[o("1700000000000-0")])
    got = [(v.value, v.valid_from, v.valid_to) for v in sink.history(T, ["old"])]
    later = version_time(entry_version("1700000000000-0"))
    assert got == [(1, created, changed), (2, changed, later), (3, later, None)]


def test_concurrent_writers_record_each_change_once(mongo_url: str, mongo_db: str) -> None:  # noqa: F811
    """Two sinks (two drainers) racing on one key: the _rev lock keeps the history exact."""
    import threading

    policies = Policies()
    policies.set(T, track=("likes",), history_limit=1000)
    sinks = [MongoSink(mongo_url, mongo_db, policies=policies) for _ in range(2)]
    entries = [(f"{1000 + i}-0", i) for i in range(30)]

    def work(s: MongoSink) -> None:
        for entry, likes in entries:
            s.write(T, ["post_id"], [{"post_id": 1, "likes": likes}], origins=[o(entry)])

    threads = [threading.Thread(target=work, args=(s,)) for s in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    doc = found(sinks[0].collection(T).find_one({"post_id": 1}))
    assert doc["likes"] == 29
    news = [h["value"] for h in doc["_history"]]
    assert news == sorted(set(news))  # every change recorded once, in order
    for s in sinks:
        s.close()


def test_data_errors_are_permanent(sink: MongoSink) -> None:
    with pytest.raises(PermanentSinkError):
        sink.write(T, ["post_id"], [{"post_id": 1, "_id": 5}])
    with pytest.raises(PermanentSinkError):
        sink.write(T, ["post_id"], [{"likes": 1}])


def test_server_down_is_a_transient_error() -> None:
    s = MongoSink(f"mongodb://127.0.0.1:{free_port()}/", "x", timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(SinkError) as info:
        s.write(T, ["post_id"], [{"post_id": 1}])
    assert not isinstance(info.value, PermanentSinkError)
    assert time.monotonic() - t0 < 5
    s.close()
