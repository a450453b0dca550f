"""Rich tables the CLI views share."""

from __future__ import annotations

from typing import Any

from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


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
        done = c.get("succeeded", 0) + c.get("failed", 0) + c.get("cancelled", 0)
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
