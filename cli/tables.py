"""Rich tables the CLI views share."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


def finished(c: Mapping[str, int]) -> int:
    """Tasks of a run (or step) that will not run again: succeeded, failed or cancelled."""
    return c.get("succeeded", 0) + c.get("failed", 0) + c.get("cancelled", 0)


def run_table(r: dict[str, Any]) -> Table:
    """One row per step of a run (`Progress.as_dict()` form): a bar of finished/dispatched and
    the counters. Shared by `trigger`'s live view and `status`."""
    tt = r["totals"]
    t = Table(
        title=f"run {r['run_id']} · {r['chain']} · {r['status']} · {r['elapsed']:.1f}s",
        title_justify="left",
    )
    cols = ("step", "task", "progress", "done/sent", "ok", "failed", "retried", "items", "stored")
    for col in cols:
        t.add_column(col, justify="left" if col in ("step", "task", "progress") else "right")
    for sid, c in r["steps"].items():
        done = finished(c)
        sent = c.get("dispatched", 0)
        t.add_row(
            sid, c.get("task", ""), ProgressBar(total=max(sent, 1), completed=done, width=24),
            f"{done}/{sent}", str(c.get("succeeded", 0)),
            Text(str(c.get("failed", 0)), style="red" if c.get("failed") else ""),
            str(c.get("retried", 0)), str(c.get("items", 0)), str(c.get("stored", 0)),
        )  # fmt: skip
    t.caption = (
        f"outstanding {r['outstanding']} · items stored {tt.get('stored', 0)}/{tt.get('items', 0)}"
        + (f" · waiting {r['waiting']}" if r.get("waiting") else "")
        + (f" · cancelled {tt['cancelled']}" if tt.get("cancelled") else "")
    )
    return t


def _when(t: float) -> str:
    lt = time.localtime(t)
    fmt = "%H:%M:%S" if time.strftime("%Y%m%d", lt) == time.strftime("%Y%m%d") else "%m-%d %H:%M"
    return time.strftime(fmt, lt)


def recent_table(recs: list[dict[str, Any]]) -> Table:
    """One line per run, newest first (`monitor.status.run_records` form)."""
    t = Table(title=f"runs (newest {len(recs)})", title_justify="left")
    for col in ("run", "chain", "status", "started", "took", "done/sent", "failed", "stored",
                "why"):  # fmt: skip
        t.add_column(col, justify="right" if col in ("took", "done/sent", "failed", "stored")
                     else "left")  # fmt: skip
    style = {"done": "green", "running": "", "paused": "yellow", "cancelling": "yellow",
             "cancelled": "red"}  # fmt: skip
    for r in recs:
        tt = r["totals"]
        done = finished(tt)
        t.add_row(
            r["run_id"], r["chain"], Text(r["status"], style=style.get(r["status"], "")),
            _when(r["created"]), f"{r['elapsed'] or 0:.0f}s", f"{done}/{tt.get('dispatched', 0)}",
            Text(str(tt.get("failed", 0)), style="red" if tt.get("failed") else ""),
            f"{tt.get('stored', 0)}/{tt.get('items', 0)}", r.get("reason") or "",
        )  # fmt: skip
    return t
