"""`trigger`'s last line: a run whose tasks robots.txt skipped does not say every task
succeeded (a run of one skipped task succeeded in nothing)."""

from __future__ import annotations

import argparse

import pytest

from chains.runner import Progress
from cli import __main__ as main
from cli import procs, runs


def ended(totals: dict[str, int]) -> Progress:
    return Progress(run_id="r1", chain="c", status="done", steps={}, totals=totals,
                    outstanding=0, waiting=0, created=0.0, finished=1.0)  # fmt: skip


def summary(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            totals: dict[str, int]) -> tuple[int, str]:  # fmt: skip
    monkeypatch.setattr(procs, "settings", lambda: None)
    monkeypatch.setattr(procs, "ensure_redis", lambda s: None)
    monkeypatch.setattr(runs, "trigger", lambda *a, **kw: ended(totals))
    a = argparse.Namespace(chain="c", seeds=None, seeds_file=None, priority=None, no_wait=False,
                           timeout=None, wait_for_workers=False)  # fmt: skip
    status = main.cmd_trigger(a)
    return status, capsys.readouterr().out


def test_a_run_whose_only_task_robots_txt_skipped_claims_no_success(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    totals = {"dispatched": 1, "succeeded": 0, "skipped": 1, "items": 0, "stored": 0}
    status, out = summary(monkeypatch, capsys, totals)
    assert status == 0  # nothing failed
    assert out == "run r1 complete: no task succeeded, 1 task skipped (robots.txt)\n"


def test_skipped_tasks_are_counted_beside_the_ones_that_succeeded(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    totals = {"dispatched": 5, "succeeded": 3, "skipped": 2, "items": 3, "stored": 3}
    _, out = summary(monkeypatch, capsys, totals)
    assert out == "run r1 complete: 3 tasks succeeded, 2 tasks skipped (robots.txt)\n"


def test_a_run_without_skips_says_every_task_succeeded(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    totals = {"dispatched": 2, "succeeded": 2, "items": 2, "stored": 2}
    _, out = summary(monkeypatch, capsys, totals)
    assert out == "run r1 complete: every task succeeded\n"
