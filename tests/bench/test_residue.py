"""bench.residue: what a crawled page leaves in Redis once its run is complete and stored."""

from __future__ import annotations

import pytest

from bench.residue import kind, measure, residue


def test_keys_are_grouped_by_kind_with_their_ids_replaced() -> None:
    tid = "0123456789abcdef0123456789abcdef"
    assert kind("cc:run:{r1}:uniq:post", "cc", "r1") == "run:{rid}:uniq:post"
    assert kind(f"cc:run:{{r1}}:deliv:{tid}:3", "cc", "r1") == "run:{rid}:deliv:{tid}:{n}"
    assert kind(f"cc:deliv:{{{tid}}}:3", "cc", "r1") == "deliv:{{tid}}:{n}"  # without a run
    assert kind("_kombu.binding.x", "cc", "r1") == "(other) _kombu.binding.x"
    kinds = residue({"cc:a": 10, "cc:gone": 5}, {"cc:a": 30, "cc:new": 7}, "cc", "r1")
    assert kinds == {"a": {"keys": 1, "bytes": 20}, "new": {"keys": 1, "bytes": 7},
                     "gone": {"keys": 0, "bytes": -5}}  # fmt: skip


@pytest.mark.integration
def test_a_finished_crawl_leaves_under_20_bytes_a_page() -> None:
    out = measure(pages=400)
    assert out["compacted"] and out["pages"] >= 400 and out["items"] == out["pages"]
    assert out["bytes_per_page"] <= 20, out["kinds"]
    per_task = (
        "run:{rid}:done",
        "run:{rid}:uniq:",
        "run:{rid}:deliv:",
        "run:{rid}:kids:",
        "run:{rid}:staged",
    )
    assert not [k for k in out["kinds"] if k.startswith((*per_task, "deliv:", "kids:"))]
