"""Rich tables the CLI views share.

Identifiers (run ids, task names, step ids, dead-letter ids, worker names) are never cut.
A table is shown as a table when it fits the console at its natural width; when it does not
(80 columns, or a pipe, where rich assumes 80), `Fit` shows the same rows as lines: the ids
on a line of their own, the other fields after them, wrapped between fields."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


def finished(c: Mapping[str, int]) -> int:
    """Tasks of a run (or step) that will not run again: succeeded, failed, cancelled or
    skipped (robots.txt)."""
    return c.get("succeeded", 0) + c.get("failed", 0) + c.get("cancelled", 0) + c.get("skipped", 0)


SKIP_REASONS = (("skipped", "robots"), ("skipped_seen", "seen"), ("skipped_unique", "unique"))


def skips(c: Mapping[str, int]) -> str:
    """A run's (or step's) skips by reason, "" if none: `robots 2 · seen 40 · unique 7`."""
    return " · ".join(f"{why} {c[k]}" for k, why in SKIP_REASONS if c.get(k))


Part = str | Text


class Fit:
    """`wide` (a table) when its natural width fits, else the same rows as lines: each row's
    ids (`head`) on a line of their own, its other fields packed on the lines below."""

    def __init__(
        self,
        wide: Table,
        title: str,
        rows: list[tuple[Part, list[Part]]],
        caption: str = "",
        bars: list[tuple[int, int]] | None = None,
        below: bool = False,
    ) -> None:
        self.wide, self.title, self.rows, self.caption = wide, title, rows, caption
        self.bars = bars  # per row, (completed, total): its progress bar, in lines too
        # `caption` on lines of its own under the wide table too, at the console's width (a
        # table's own caption wraps at the table's width: a narrow table broke it mid-list)
        self.below = below

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        natural = Measurement.get(console, options.update_width(100_000), self.wide).maximum
        if natural <= options.max_width:
            yield self.wide
            if self.below and self.caption:
                yield Text(self.caption, style="dim", overflow="fold")
            return
        yield Text(self.title, style="italic", overflow="fold")
        for n, (head, parts) in enumerate(self.rows):
            yield head if isinstance(head, Text) else Text(head, style="bold", overflow="fold")
            if self.bars is not None:
                done, total = self.bars[n]
                width = max(10, min(40, options.max_width - 2))
                yield Padding(
                    ProgressBar(total=max(total, 1), completed=done, width=width), (0, 0, 0, 2)
                )
            yield pack(parts, options.max_width)
        if self.caption:
            yield Text(self.caption, style="dim", overflow="fold")


def pack(parts: list[Part], width: int, indent: str = "  ") -> Text:
    """Fields on indented lines, ` · ` between them, a line broken between fields only."""
    lines: list[Text] = []
    line = Text(indent)
    for p in (p for p in parts if p):
        text = p if isinstance(p, Text) else Text(p)
        if len(line) > len(indent) and len(line) + 3 + len(text) > width:
            lines.append(line)
            line = Text(indent)
        if len(line) > len(indent):
            line.append(" · ", style="dim")
        line.append(text)
    lines.append(line)
    return Text("\n", overflow="fold").join(lines)


def labelled(label: str, value: Part) -> Text:
    return Text(f"{label} ").append(value)


def ident_column(t: Table, header: str, **kw: Any) -> None:
    """A column of identifiers: never wrapped or folded."""
    t.add_column(header, no_wrap=True, **kw)


def _red(n: int) -> Text:
    return Text(str(n), style="red" if n else "")


def _ending(r: dict[str, Any]) -> str:
    """The run's status, and for a finished run with failures how many (done is not ok)."""
    failed = r.get("failed", r["totals"].get("failed", 0))
    if r["status"] == "done" and failed:
        return f"done with {failed} failed task(s)"
    return str(r["status"])


def empty_warning(r: dict[str, Any], lead: str = "") -> str:
    """Pages that yielded nothing (no item, no follow-up), by step: a selector matching nothing
    ends a run "complete" with no items; this says so (`Progress.as_dict()` form)."""
    n = r["totals"].get("empty", 0)
    if not n:
        return ""
    by = ", ".join(f"{s} {c['empty']}" for s, c in r["steps"].items() if c.get("empty"))
    return (
        f"{lead}warning: {n} page(s) yielded nothing (no item, no follow-up): {by}; "
        "a selector that matches nothing? (@endpoint(..., must_yield=True) fails them)"
    )


def run_table(r: dict[str, Any]) -> Fit:
    """One row per step of a run (`Progress.as_dict()` form): a bar of finished/dispatched and
    the counters. Shared by `trigger`'s live view, `runs RUN_ID` and `status`."""
    tt = r["totals"]
    title = f"run {r['run_id']} · {r['chain']} · {_ending(r)} · {r['elapsed']:.1f}s"
    caption = (
        f"outstanding {r['outstanding']} · items stored {tt.get('stored', 0)}/{tt.get('items', 0)}"
        + (f" · waiting {r['waiting']}" if r.get("waiting") else "")
        + (f" · cancelled {tt['cancelled']}" if tt.get("cancelled") else "")
        + (f" · skipped: {skips(tt)}" if skips(tt) else "")
        + _resending(r)
        + empty_warning(r, "\n")
        + (
            f"\nwarning: text with undecodable bytes (stored with U+FFFD) on {tt['undecodable']} "
            "pages of " + ", ".join(s for s, c in r["steps"].items() if c.get("undecodable"))
            if tt.get("undecodable")
            else ""
        )
    )
    t = Table(title=title, title_justify="left", caption=caption)
    if r.get("resending"):
        t.caption_style = "bold red"
    ident_column(t, "step")
    ident_column(t, "task")
    t.add_column("progress")
    for col in ("done/sent", "ok", "failed", "retried", "skipped", "items", "stored"):
        t.add_column(col, justify="right")
    rows: list[tuple[Part, list[Part]]] = []
    bars: list[tuple[int, int]] = []
    for sid, c in r["steps"].items():
        done = finished(c)
        sent = c.get("dispatched", 0)
        bars.append((done, sent))
        skipped = Text(
            str(sum(c.get(k, 0) for k, _ in SKIP_REASONS)), style="yellow" if skips(c) else ""
        )
        nums: list[Part] = [
            str(c.get("succeeded", 0)),
            _red(c.get("failed", 0)),
            str(c.get("retried", 0)),
            skipped,
            str(c.get("items", 0)),
            str(c.get("stored", 0)),
        ]
        t.add_row(
            sid,
            c.get("task", ""),
            ProgressBar(total=max(sent, 1), completed=done, width=24),
            f"{done}/{sent}",
            *nums,
        )
        pct = f" ({done / sent:.0%})" if sent else ""
        rows.append(
            (
                f"{sid}  {c.get('task', '')}",
                [
                    f"done/sent {done}/{sent}{pct}",
                    labelled("ok", nums[0]),
                    labelled("failed", nums[1]),
                    labelled("retried", nums[2]),
                    labelled("skipped", nums[3]),
                    labelled("items", nums[4]),
                    labelled("stored", nums[5]),
                ],
            )
        )
    return Fit(t, title, rows, caption, bars)


def _resending(r: Mapping[str, Any]) -> str:
    n = r.get("resending")
    if not n:
        return ""
    return f" · re-sent {n} since its last progress (a loop? the workers' log names the tasks)"


def _when(t: float) -> str:
    lt = time.localtime(t)
    fmt = "%H:%M:%S" if time.strftime("%Y%m%d", lt) == time.strftime("%Y%m%d") else "%m-%d %H:%M"
    return time.strftime(fmt, lt)


def recent_table(recs: list[dict[str, Any]]) -> Fit:
    """One line per run, newest first (`monitor.status.run_records` form)."""
    title = f"runs (newest {len(recs)})"
    t = Table(title=title, title_justify="left")
    ident_column(t, "run")
    ident_column(t, "chain")
    for col in ("status", "started", "took", "done/sent", "failed", "stored", "why"):
        t.add_column(
            col, justify="right" if col in ("took", "done/sent", "failed", "stored") else "left"
        )
    style = {
        "done": "green",
        "running": "",
        "paused": "yellow",
        "cancelling": "yellow",
        "storing": "cyan",
        "cancelled": "red",
    }
    rows: list[tuple[Part, list[Part]]] = []
    for r in recs:
        tt = r["totals"]
        status = Text(r["status"], style=style.get(r["status"], ""))
        cells = (
            _when(r["created"]),
            f"{r['elapsed'] or 0:.0f}s",
            f"{finished(tt)}/{tt.get('dispatched', 0)}",
            _red(tt.get("failed", 0)),
            f"{tt.get('stored', 0)}/{tt.get('items', 0)}",
            r.get("reason") or "",
        )
        t.add_row(r["run_id"], r["chain"], status, *cells)
        head = Text(f"{r['run_id']}  {r['chain']}  ", style="bold", overflow="fold")
        rows.append(
            (
                head.append(status),
                [
                    f"started {cells[0]}",
                    f"took {cells[1]}",
                    f"done/sent {cells[2]}",
                    labelled("failed", cells[3]),
                    f"stored {cells[4]}",
                    cells[5],
                ],
            )
        )
    return Fit(t, title, rows)
