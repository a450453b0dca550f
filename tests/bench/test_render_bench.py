"""bench/render_bench.py runs end to end on a small demo and reports what it promises."""

from __future__ import annotations

import json

import pytest

from bench import render_bench, render_worker
from tests.external_interface.browser_fixtures import needs_browser

pytestmark = [needs_browser, pytest.mark.integration]


def test_a_short_run_reports_both_ways_and_the_memory(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "--size",
        "tiny",
        "--pages",
        "6",
        "--memory-pages",
        "50",
        "--context-pages",
        "20",
        "--json",
    ]
    assert render_bench.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    for name in ("detail", "list"):
        rendered, plain = out[name]["rendered"], out[name]["plain"]
        assert rendered["pages"] == plain["pages"] == 6 and rendered["items"] == plain["items"] > 0
        # a render costs far more CPU than a fetch, counted over the driver and Chromium's tree
        assert rendered["cpu_ms_per_page"] > 5 * plain["cpu_ms_per_page"] > 0
        assert rendered["mb"] > plain["mb"] > 0
    mem = out["memory"]
    assert mem["pages"] == 50 and len(mem["samples"]) == 2 and mem["contexts_recycled"] >= 2
    assert out["pool"]["renders"] >= 2 * 6 + 50


def test_the_worker_run_reports_both_ways_through_real_tasks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert render_worker.main(["--size", "tiny", "--pages", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rendered, plain = out["rendered"], out["plain"]
    for way in (rendered, plain):
        assert way["pages"] == way["stored"] == 6 and way["failed"] == 0 and way["samples"] >= 1
    # the plain run's tree is the worker alone: it never started a browser
    assert plain["tree_mb_peak"] == pytest.approx(plain["worker_mb_peak"], rel=0.05)
    assert rendered["tree_mb_peak"] > 3 * plain["tree_mb_peak"]
    assert rendered["cpu_ms_per_page"] > 5 * plain["cpu_ms_per_page"] > 0
