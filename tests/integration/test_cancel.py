"""Cancelling a run (`chains.cancel`, `RunHandle.cancel`, `control.sh cancel`): real workers
stop fetching its pages within about a second, the run ends `cancelled` with every dispatched
task accounted for, what it stored stays stored, and other runs go on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

import chains
from config import ROOT
from exceptions import UnknownChainError
from tests.testsite import chains as tchains

pytestmark = pytest.mark.integration

PAGES = 120  # 0.5 s each, 4 page slots: 15 s if it ran to the end


def _fetched(test_site: Any, key: str) -> int:
    return sum(test_site.hits[f"flaky:e1-{i}-{key}"] for i in range(PAGES))


def test_a_cancelled_run_stops_fetching_and_ends_cancelled_while_another_completes(
    start_worker, test_site: Any, cc_env: dict[str, str]
) -> None:
    # a visibility timeout of 120 s lets a batch keep its pages for 30 s (`_batch_budget`)
    start_worker(concurrency=4, name="cancel", CHAINCRAWL_VISIBILITY_TIMEOUT="120")
    key = f"cancel{int(time.time() * 1000)}"
    doomed = chains.run(
        tchains.probe(f"/flaky/{{entry_id}}-{key}?fails=0&delay=0.5"), seeds=[{"per": PAGES}]
    )
    deadline = time.monotonic() + 30
    while _fetched(test_site, key) < 8:
        assert time.monotonic() < deadline, doomed.progress().totals
        time.sleep(0.02)
    # from another process, as a user would: control.sh cancel RUN_ID --reason ...
    out = subprocess.run(
        [sys.executable, "-m", "cli", "cancel", doomed.run_id, "--reason", "wrong seeds"],
        cwd=ROOT, env={**os.environ, **cc_env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"run {doomed.run_id} cancelled" in out.stdout, out.stdout
    t_cancel = time.monotonic()
    at_cancel = _fetched(test_site, key)
    other = chains.run(tchains.probe(f"/flaky/{{entry_id}}-{key}x?fails=0"), seeds=[{"per": 5}])

    p = doomed.wait(timeout=30)
    took = time.monotonic() - t_cancel
    assert p.status == "cancelled" and not p.complete and p.ended, p.as_dict()
    t = p.totals
    fetched = _fetched(test_site, key)
    probe = p.steps["local.probe"]
    assert probe["dispatched"] == PAGES
    assert probe["succeeded"] + probe["cancelled"] == PAGES, probe
    assert probe["succeeded"] == fetched, (probe, fetched)  # every fetched page was committed
    assert t["failed"] == 0 and p.outstanding == 0
    assert t["stored"] == t["items"] > 0  # what ran is stored and stays
    # The pages being fetched finish, and a batch notices within a second (4 slots of 0.5 s
    # pages: at most 8 more); the rest are skipped without a request. Without that second
    # look a batch's pages, which all begin with it, would all be fetched: measured 72 more, against 0.
    assert fetched - at_cancel <= 8, (at_cancel, fetched)
    assert probe["cancelled"] >= PAGES // 2, probe
    print(f"\ncancelled after {at_cancel} pages; {fetched - at_cancel} more fetched, "
          f"{probe['cancelled']} skipped; ended {took:.1f}s after the cancel")  # fmt: skip

    q = other.wait(timeout=30)  # started after the cancel, on the same workers: unaffected
    assert q.complete and q.steps["local.probe"]["succeeded"] == 5, q.totals

    again = chains.cancel(doomed.run_id)
    assert again.was == "cancelled"
    with pytest.raises(UnknownChainError, match="no run 'nope'"):
        chains.cancel("nope")
