"""`trigger`'s output: piped to a file or another program, the live view's last frame ends
with a newline, so the line printed after it (`run ... complete`) starts a line of its own;
the run's warning (no worker up) is said once."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

import chains
from chains.runner import Progress
from cli.runs import RUNS_LOG, trigger, watch


def _progress() -> Progress:
    counts = {"dispatched": 1, "succeeded": 1, "failed": 0, "items": 4, "stored": 4}
    return Progress(
        run_id="r" * 16, chain="c", status="done", steps={"s": counts}, totals=counts,
        outstanding=0, waiting=0, created=0.0, finished=1.0, tasks={"s": "site.pc.s"},
    )  # fmt: skip


class _Handle:
    def wait(self, timeout: Any, poll: float, on_progress: Callable[[Progress], None]) -> Progress:
        p = _progress()
        on_progress(p)
        return p


def test_piped_live_view_ends_its_last_line() -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=100, force_terminal=False, color_system=None)
    watch(_Handle(), console=console)  # type: ignore[arg-type]
    print("run rrrr complete: every task succeeded", file=buf)
    out = buf.getvalue()
    assert out.endswith("items stored 4/4\nrun rrrr complete: every task succeeded\n"), out[-120:]


def test_the_no_worker_note_is_printed_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """chains.run logs the note too (for library callers); `trigger` prints it itself."""
    note = "no worker is up yet: the run is recorded and waits in the broker (./control.sh start)"

    def fake_run(name: str, **kw: Any) -> Any:
        RUNS_LOG.warning("chain %s: %s", name, note)
        return SimpleNamespace(run_id="r" * 16, note=note)

    logged: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record)

    handler = Keep()
    monkeypatch.setattr(chains, "run", fake_run)
    RUNS_LOG.addHandler(handler)
    try:
        trigger("c", None, None, wait=False, timeout=None)
    finally:
        RUNS_LOG.removeHandler(handler)
    assert logged == []  # not to the terminal by Python's last-resort handler either
    assert capsys.readouterr().out.count(f"warning: {note}\n") == 1  # one line, however wide
    assert not RUNS_LOG.disabled
