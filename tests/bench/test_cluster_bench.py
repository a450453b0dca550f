"""bench.cluster_bench: a small run of every scenario completes its runs exactly (the crawl
asserts each run's counters) and reports per-page figures for each."""

from __future__ import annotations

import json

import pytest

from bench import cluster_bench

pytestmark = pytest.mark.integration


def test_a_small_bench_reports_every_scenario(capsys) -> None:
    cluster_bench.main(["--pages", "200", "--runs", "4", "--dedup", "20000"])
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"one_redis", "one_redis_with_a_replica", "cluster_3_masters",
                        "cluster_3_masters_random_run_ids", "cluster_3_masters_wait_1",
                        "dedup_on_cluster"}  # fmt: skip
    for name in ("one_redis", "cluster_3_masters"):
        assert out[name]["pages"] == 200 and out[name]["commands_per_page"] > 5
        assert out[name]["redis_cpu_us_per_page"] > 0
    placed = out["cluster_3_masters"]
    assert len(placed["share_per_master"]) == 3 and abs(sum(placed["share_per_master"]) - 1) < 0.01
    # The shares are printed rounded to 3 places and the ratio from the unrounded shares.
    assert abs(placed["busiest_master_vs_mean"] - max(placed["share_per_master"]) * 3) <= 0.011
    assert out["dedup_on_cluster"]["records"] == 20_000
