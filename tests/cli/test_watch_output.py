"""`trigger`'s live view piped to a file or another program: its last frame ends with a
newline, so the line printed after it (`run ... complete`) starts a line of its own."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from rich.console import Console

from chains.runner import Progress
from cli.runs import watch


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
