from __future__ import annotations

import pytest

from utils.affinity import core_for, worker_index


@pytest.mark.parametrize(
    ("nodename", "n"),
    [("w1@host", 1), ("w12@host", 12), ("bench40715-2@vm", 2), ("demo@host", None), ("", None)],
)
def test_worker_number_is_the_digits_before_the_at(nodename: str, n: int | None) -> None:
    assert worker_index(nodename) == n


def test_auto_pins_threads_workers_round_robin_over_the_allowed_cores() -> None:
    cores = [2, 5]
    got = [core_for("auto", "threads", f"w{n}@h", cores) for n in (1, 2, 3, 4)]
    assert got == [2, 5, 2, 5]


@pytest.mark.parametrize("pool", ["gevent", "solo", "prefork"])
def test_auto_leaves_one_thread_pools_and_prefork_to_the_kernel(pool: str) -> None:
    assert core_for("auto", pool, "w1@h", [0, 1]) is None


def test_on_pins_gevent_and_solo_but_never_prefork() -> None:
    assert core_for("on", "gevent", "w2@h", [0, 1]) == 1
    assert core_for("on", "solo", "w1@h", [0, 1]) == 0
    assert core_for("on", "prefork", "w1@h", [0, 1]) is None


def test_off_and_unnumbered_workers_are_not_pinned() -> None:
    assert core_for("off", "threads", "w1@h", [0, 1]) is None
    assert core_for("auto", "threads", "crawler@h", [0, 1]) is None
    assert core_for("auto", "threads", "w0@h", [0, 1]) is None


def test_unknown_mode_names_the_setting_and_its_choices() -> None:
    with pytest.raises(ValueError, match="CHAINCRAWL_PIN_CORES must be one of auto, on, off"):
        core_for("yes", "threads", "w1@h", [0])
