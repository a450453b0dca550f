"""The demo's summary at 80 columns: every path on one line of its own, whole (a table
column that narrow would break a file name in the middle)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from cli.demo import show_summary, site_line
from cli.parser import DEMO_FEATURES

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


def test_the_demo_site_line_fits_80_columns_with_the_default_features() -> None:
    """It wrapped in the middle of the feature list (92 characters)."""
    buf = io.StringIO()
    console = Console(file=buf, width=80, color_system=None)
    for port in (8700, 65535):
        console.print(
            site_line(f"http://127.0.0.1:{port}", "medium", DEMO_FEATURES), soft_wrap=True
        )
    console.print(site_line("http://127.0.0.1:8700", "small", ""), soft_wrap=True)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines), lines
    assert lines[0] == f"demo site: http://127.0.0.1:8700 (medium: {DEMO_FEATURES})"
    assert lines[2].endswith("(small: no anti-crawl features)")
