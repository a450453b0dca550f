from __future__ import annotations

import os
import subprocess
import sys
from typing import cast

import pytest

# bench.compare runs the Scrapy baseline: without the bench extras (a checkout set up by
# `./control.sh setup` alone) these tests skip instead of failing at collection
pytest.importorskip("scrapy", reason="the bench extras: pip install -r requirements/bench.txt")

from bench import pinning
from bench.compare import (
    SCENARIOS,
    Row,
    best_of,
    check,
    paired,
    plan,
    ratio_lines,
    spread,
)
from bench.pagesets import PAGESETS
from bench.scrapy_spider import CONFIGS
from bench.systems import RunResult


def _row(system: str, values: list[float | None], key: str = "cpu_ms_per_page") -> Row:
    return Row("cpu", "shop", system, system, [None if v is None else {key: v} for v in values])


def test_ratios_pair_the_runs_of_one_repeat_not_sorted_values() -> None:
    cc = _row("chaincrawl", [3.0, 2.0, 4.0])
    peer = _row("crawlee", [2.0, 4.0, 2.0])
    assert paired(cc, peer, "cpu_ms_per_page") == [1.5, 0.5, 2.0]
    # sorted medians would give 3.0 / 2.0 = 1.5; the pairs' median is 1.5 too, but min and max
    # come from pairs: 0.5 and 2.0, not 2.0/4.0 and 4.0/2.0
    assert spread(paired(cc, peer, "cpu_ms_per_page")) == (0.5, 1.5, 2.0)


def test_a_failed_run_drops_its_pair_only() -> None:
    cc = _row("chaincrawl", [3.0, None, 4.0])
    peer = _row("scrapy:broad", [2.0, 4.0, None])
    assert paired(cc, peer, "cpu_ms_per_page") == [1.5]
    assert spread([]) is None


def test_chaincrawl_rows_are_divided_by_each_peer_familys_best() -> None:
    sc = SCENARIOS["cpu"]
    rows = [
        _row("chaincrawl", [3.0, 3.3]),
        _row("scrapy:defaults", [4.0, 4.4]),
        _row("scrapy:broad-lean", [2.0, 3.0]),
        _row("crawlee", [1.5, 1.1]),
        _row("floor", [1.0, 1.1]),
    ]
    best = best_of(rows, "scrapy", "cpu")
    assert best is not None and best.system == "scrapy:broad-lean"
    got = {
        (p["num"], p["den"]): [round(x, 9) for x in p["per_repeat"]] for p in ratio_lines(sc, rows)
    }
    assert got == {
        ("chaincrawl", "scrapy:broad-lean"): [1.5, 1.1],
        ("chaincrawl", "crawlee"): [2.0, 3.0],
        ("chaincrawl", "floor"): [3.0, 3.0],
    }
    rate = [_row("scrapy:a", [50.0], "pages_per_s"), _row("scrapy:b", [60.0], "pages_per_s")]
    best = best_of(rate, "scrapy", "rate")
    assert best is not None and best.system == "scrapy:b"  # more pages/s is better


def test_scale_pairs_two_workers_with_one() -> None:
    sc = SCENARIOS["scale"]
    rows = [
        _row("chaincrawl", [1000.0, 900.0], "pages_per_s"),
        _row("chaincrawl-x2", [1700.0, 1800.0], "pages_per_s"),
    ]
    (pair,) = ratio_lines(sc, rows)
    assert (pair["num"], pair["den"]) == ("chaincrawl-x2", "chaincrawl")
    assert pair["per_repeat"] == [1.7, 2.0]


def test_plan_maps_old_names_and_expands_scrapy_configurations() -> None:
    ((latency, keys),) = plan(["lat250"], None, None, [])
    assert latency.name == "latency" and latency.latency_ms == 250 and latency.bound() == 64
    assert keys == ["chaincrawl", "scrapy-best", "crawlee"]
    ((_, keys),) = plan(["cpu"], None, "all", ["nometrics"])
    assert [k for k in keys if k.startswith("scrapy")] == [f"scrapy:{c}" for c in CONFIGS]
    assert keys[-1] == "chaincrawl+nometrics" and "crawlee" in keys and "floor" in keys


def test_a_run_that_misses_or_repeats_a_page_is_an_error() -> None:
    ps = PAGESETS["small"].build()
    assert ps.expected_pages == 105

    def res(items: int = 105, handled: int = 105, **extra: int) -> RunResult:
        return RunResult(items, handled, 1.0, {"crawler": 0.1}, 50.0, dict(extra))

    ok = {"total": 105, "distinct": 105, "unknown": 0}
    assert check(ps, res(), ok) is None
    # a run with something wrong: `check` says what (a str)
    assert "requests 106, distinct pages 104" in cast(
        str, check(ps, res(), {**ok, "total": 106, "distinct": 104})
    )
    assert "items 104" in cast(str, check(ps, res(items=104), ok))
    assert "unknown requests 1" in cast(
        str, check(ps, res(), {**ok, "unknown": 1, "unknown_paths": ["/x"]})
    )
    assert "failed tasks 2" in cast(str, check(ps, res(failed=2), ok))


@pytest.mark.skipif(not pinning.supported(), reason="no sched_setaffinity here")
def test_pinned_covers_threads_and_children_and_is_undone() -> None:
    import threading

    ready, done = threading.Event(), threading.Event()
    seen: dict[str, set[int]] = {}

    def thread() -> None:  # started before pinning: must be moved too
        ready.set()
        done.wait(10)
        seen["thread"] = os.sched_getaffinity(0)

    t = threading.Thread(target=thread)
    t.start()
    ready.wait(10)
    code = "import os,sys; print(sorted(os.sched_getaffinity(0))); sys.stdin.read()"
    before = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert before.stdout is not None
        assert before.stdout.readline()  # running, so pinning finds it as a child
        cores = pinning.allowed()
        first = cores[0]
        with pinning.pinned(1):
            assert os.sched_getaffinity(0) == {first}
            assert os.sched_getaffinity(before.pid) == {first}
            done.set()
            t.join(10)
            once = "import os; print(sorted(os.sched_getaffinity(0)))"
            after = subprocess.run([sys.executable, "-c", once], capture_output=True, text=True)
            assert after.stdout.strip() == f"[{first}]"  # started while pinned: inherits it
        assert seen["thread"] == {first}
        assert os.sched_getaffinity(0) == set(cores)
        assert os.sched_getaffinity(before.pid) == set(cores)
    finally:
        done.set()
        before.kill()
        before.wait()


@pytest.mark.skipif(not pinning.supported(), reason="no sched_setaffinity here")
def test_pinning_to_more_cores_than_allowed_is_refused() -> None:
    n = len(pinning.allowed()) + 1
    with pytest.raises(ValueError, match=f"cannot pin to {n} cores"), pinning.pinned(n):
        pass


def test_loop_ms_measures_cpu_time_of_a_fixed_loop() -> None:
    from bench.compare import loop_ms

    small, big = loop_ms(20_000), loop_ms(400_000)
    assert 0 < small < big  # CPU time grows with the work, whatever the machine's speed
