"""The demo's summary at 80 columns: every path on one line of its own, whole (a table
column that narrow would break a file name in the middle)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from cli.demo import show_summary

PATH = "/home/someone/projects/chaincrawl/var/items/demo.comment/demo.comment.jsonl"


def summary_table() -> Table:
    t = Table(title="demo crawl summary · run 0123456789abcdef", show_header=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    t.add_row("chain", "demo_social")
    t.add_row("items are in", f"{PATH}\n{PATH.replace('comment', 'post')}\n(JSON Lines)")
    t.add_row("look at them", f"head -n 3 {PATH}")
    return t


def shown(width: int) -> str:
    buf = io.StringIO()
    show_summary(Console(file=buf, width=width, color_system=None), summary_table())
    return buf.getvalue()


def test_paths_stay_whole_at_80_columns() -> None:
    out = shown(80)
    lines = out.splitlines()
    assert f"  {PATH}" in lines and f"  {PATH.replace('comment', 'post')}" in lines
    assert f"  head -n 3 {PATH}" in lines
    assert "items are in" in lines and "demo crawl summary" in lines[0]


def test_a_wide_terminal_gets_the_table() -> None:
    out = shown(200)
    assert "┃" in out or "│" in out
    assert PATH in out
