"""`control.sh report`: one self-contained HTML file of how the crawls went (data.py gathers
the numbers from where they live, html.py draws them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from config import Settings
from monitor.report.data import gather, parse_since
from monitor.report.html import render

__all__ = ["gather", "parse_since", "render", "write_report"]


def write_report(
    path: Path | str, client: Any, s: Settings | None = None, **select: Any
) -> dict[str, Any]:
    """Gather (`run_id`, `site`, `since`), render and write `path` atomically; -> the data."""
    data = gather(client, s, **select)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render(data), encoding="utf-8")
    os.replace(tmp, path)
    return data
