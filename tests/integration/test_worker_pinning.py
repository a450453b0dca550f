"""Real workers pin themselves by pool and number (utils/affinity.py, worker._pin_core)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.conftest import WorkerProc
from utils import affinity

pytestmark = pytest.mark.skipif(not affinity.supported(), reason="no sched_setaffinity here")


def masks(pid: int) -> set[tuple[int, ...]]:
    """The affinity of every thread of `pid` (the pool's threads included)."""
    return {tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.parametrize(
    ("pool", "mode", "name", "pinned"),
    [
        ("threads", "auto", "pin2", True),
        ("gevent", "auto", "pin2", False),
        ("gevent", "on", "pin2", True),
        ("threads", "off", "pin2", False),
        ("threads", "auto", "pin", False),  # no number: the kernel places it
    ],
)
def test_worker_pins_itself(
    cc_env: dict[str, str], tmp_path: Path, pool: str, mode: str, name: str, pinned: bool
) -> None:
    cores = affinity.allowed()
    env = {**cc_env, "CHAINCRAWL_PIN_CORES": mode}
    w = WorkerProc(env, tmp_path / "w.log", pool, 4, name)
    try:
        w.wait_ready()
        want = (cores[1 % len(cores)],) if pinned else tuple(cores)
        assert masks(w.proc.pid) == {want}
        assert (f"pinned to core {want[0]} ({pool} pool" in w.text()) == pinned
    finally:
        w.stop()
