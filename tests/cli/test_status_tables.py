"""`status` draws the re-crawl and fleet tables from a snapshot's rows."""

from __future__ import annotations

from rich.console import Console

from cli.status import render


def snap(**extra: object) -> dict[str, object]:
    return {"time": 0.0, "workers": None, "queues": {}, "unacked": 0, "active_runs": [],
            "dead_letters": 0, "outbox": {}, "tasks": {}, "pools": [], **extra}  # fmt: skip


def text(s: dict[str, object]) -> str:
    console = Console(width=250, record=True)
    console.print(render(s))
    return console.export_text()


def test_the_recrawl_table_shows_budget_visits_bought_and_changes_found() -> None:
    row = {"watch": "posts", "site": "demo", "budget": 2000.0, "keys": 1000,
           "last_day": {"visits": 1900, "changes": 420, "bought": 1864, "found": 410},
           "total": {"visits": 9000, "changes": 2000, "bought": 8800, "found": 1990,
                     "dispatched": 8900, "dropped": 0},
           "hot_hours": [8, 9, 19], "mean_interval_h": 12.0}  # fmt: skip
    out = text(snap(recrawl=[row]))
    assert "re-crawls by change" in out and "demo / posts" in out
    assert "1864 / 8800" in out and "410 / 1990" in out and "8,9,19" in out


def test_the_fleet_table_names_a_shortage() -> None:
    row = {"site": "shop", "weight": 1.0, "priority": 5, "nominal": 5.0, "share": 10.0,
           "held": 3, "waiting": 0, "backlog": 40, "entitled": 10.0, "rate": None,
           "runs_at": 0.3, "shortage": "the cookie pool is exhausted (0 of 0 ready)"}  # fmt: skip
    out = text(snap(fleet=[row]))
    assert "fleet budget shares" in out and "30%" in out
    assert "the cookie pool is exhausted" in out


def test_throttle_waits_are_shown_apart_from_errors() -> None:
    """A crawl whose every page succeeded: its throttle waits are no "top errors"."""
    task = {"succeeded": 400, "failed": 0, "retried": 3, "fail_rate": 0.0, "retry_rate": 0.0075,
            "latency_p95": 0.2, "errors": {"waited": {"Throttled": 908},
                                           "retried": {"RateLimited": 3}}}  # fmt: skip
    out = text(snap(tasks={"demo.pc.feed": task}))
    header = next(line for line in out.splitlines() if "top errors" in line)
    row = next(line for line in out.splitlines() if "demo.pc.feed" in line)
    assert "waits" in header
    errors_at, waits_at = header.index("top errors"), header.index("waits")
    assert row.index("RateLimited 3") in range(errors_at, waits_at)
    assert row.index("Throttled 908") >= waits_at
    quiet = text(snap(tasks={"t": {**task, "errors": {"waited": {"Throttled": 9}}}}))
    header = next(line for line in quiet.splitlines() if "top errors" in line)
    row = next(line for line in quiet.splitlines() if line.lstrip("│ ").startswith("t "))
    assert row.index("Throttled 9") >= header.index("waits")


def test_what_was_started_here_is_one_line_under_a_narrow_workers_table() -> None:
    """The workers table is narrow: as its caption the list wrapped at the table's width,
    mid-list ('started here: redis (30525),' / 'worker-w1 (5926)')."""
    workers = {"w1@vm": {"active": 0, "tasks": []}}
    started = {"redis": 30525, "flower": 5926, "monitor": 5930}  # (a worker's pid is looked at)
    for w in (workers, {}):  # workers answering, and none
        console = Console(width=100, record=True)
        console.print(render(snap(workers=w, processes=started)))
        lines = console.export_text().splitlines()
        want = "started here: redis (30525), flower (5926), monitor (5930)"
        assert any(line.rstrip() == want for line in lines), lines
