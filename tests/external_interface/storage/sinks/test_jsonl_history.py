"""Field history in the JSON Lines store: the tracked values of compacted lines are kept."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from external_interface.storage.sinks.base import Origin, Policies, entry_version
from external_interface.storage.sinks.history import version_time
from external_interface.storage.sinks.jsonl import JsonlSink, read_items

T = "demo.post"
ENTRIES = ["1700000000000-0", "1700000060000-0", "1700000120000-0", "1700000180000-0"]


def sink(root: Path, mode: str = "latest") -> JsonlSink:
    p = Policies()
    p.set(T, track=("likes", "stats.views"))
    return JsonlSink(root, mode=mode, fsync=False, policies=p)


def o(entry: str) -> Origin:
    return Origin(entry, "r1", "feed", "demo.h5.feed")


@pytest.mark.parametrize("mode", ["latest", "append"])
def test_a_field_changed_three_times_reads_back_as_three_versions(
    tmp_path: Path, mode: str
) -> None:
    s = sink(tmp_path, mode)
    for entry, likes in zip(ENTRIES, (3, 5, 5, 8), strict=True):  # 5 twice: no new version
        s.write(T, ["post_id"], [{"post_id": "p1", "likes": likes, "stats": {"views": 1}},
                                 {"post_id": "p2", "likes": 0}], origins=[o(entry)] * 2)  # fmt: skip
        if mode == "latest":
            s.compact(T)  # older lines dropped after every write
    if mode == "latest":
        assert (tmp_path / T / ".history").is_file()
        assert [i["likes"] for i in read_items(T, tmp_path)] == [8, 0]  # one line per key
    got = [v for v in s.history(T, ["p1"]) if v.field == "likes"]
    t0 = version_time(entry_version(ENTRIES[0]))
    assert [(v.value, v.valid_from - t0, v.valid_to and v.valid_to - t0) for v in got] == [
        (3, timedelta(0), timedelta(minutes=1)),
        (5, timedelta(minutes=1), timedelta(minutes=3)),
        (8, timedelta(minutes=3), None),
    ]
    assert [(v.field, v.value, v.valid_to) for v in s.history(T, ["p1"])
            if v.field != "likes"] == [("stats.views", 1, None)]  # fmt: skip
    assert [v.value for v in s.history(T, ["p2"])] == [0]
    assert s.history(T, ["nope"]) == []


def test_a_compaction_cut_short_counts_each_observation_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = sink(tmp_path)
    for entry, likes in zip(ENTRIES[:3], (1, 2, 3), strict=True):
        s.write(T, ["post_id"], [{"post_id": "p1", "likes": likes}], origins=[o(entry)])
    from external_interface.storage.sinks.jsonl.store import TypeStore

    def crash(self: TypeStore, *a: object, **kw: object) -> None:
        raise OSError("disk gone at the commit point")

    with monkeypatch.context() as m:
        m.setattr(TypeStore, "write_base", crash)
        with pytest.raises(OSError):
            s.compact(T)  # the history file has the records, the parts still have the lines
    s.compact(T)  # and again, for real: the records are written a second time
    assert [v.value for v in s.history(T, ["p1"])] == [1, 2, 3]
