"""`control.sh limits`: robots.txt's line names how long rules are kept and both waits after a
robots.txt that could not be read (an error answer, no answer), with the settings behind them."""

from __future__ import annotations

import argparse
import json

import pytest

from cli import ops, procs
from config import Settings
from scheduling import gate


def limits(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
           as_json: bool, error_ttl: float, unreachable_ttl: float) -> str:  # fmt: skip
    s = Settings(limits="", default_limits="off", throttle=False, robots_ttl=3600,
                 robots_error_ttl=error_ttl, robots_unreachable_ttl=unreachable_ttl)  # fmt: skip
    real = gate.politeness_report
    monkeypatch.setattr(procs, "require_redis", lambda s: None)  # nothing here reads Redis
    monkeypatch.setattr(gate, "politeness_report", lambda: real(s))
    ops.cmd_limits(argparse.Namespace(json=as_json))
    return capsys.readouterr().out


def test_limits_shows_the_two_robots_error_waits(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = limits(monkeypatch, capsys, False, error_ttl=300, unreachable_ttl=2)
    line = next(x for x in out.splitlines() if x.startswith("robots.txt:"))
    assert "kept 3600s" in line
    assert "wait 300s after its robots.txt answers 5xx/429 (CHAINCRAWL_ROBOTS_ERROR_TTL)" in line
    assert ("2s after a fetch of it gets no answer, doubling with each in a row up to 300s "
            "(CHAINCRAWL_ROBOTS_UNREACHABLE_TTL)") in line  # fmt: skip


def test_limits_json_has_them_too_the_unreachable_wait_capped_as_robots_txt_caps_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = limits(monkeypatch, capsys, True, error_ttl=60, unreachable_ttl=90)
    r = json.loads(out)["robots"]
    assert (r["ttl"], r["error_ttl"], r["unreachable_ttl"]) == (3600, 60, 60)
