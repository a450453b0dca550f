"""`control.sh shell` after a fetch that got no page: CODE (`-c`) or a line typed in the session
reading `resp` (None) ends in one line that says why (robots.txt, with how to check or
override it), not a traceback; a relative URL after it still has the URL asked to go by."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

import sites
from cli import shell
from exceptions import FetchError, RobotsDisallowed

URL = "http://127.0.0.1:9/private/page"


class Refusing:
    """A context whose every request is refused with `exc`."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.asked: list[str] = []  # the URLs requested
        self.status = -1  # the shell's exit status, once it ran

    def request(self, method: str, url: str, **kw: Any) -> None:
        self.asked.append(url)
        raise self.exc


def run_with(
    monkeypatch: pytest.MonkeyPatch,
    exc: Exception,
    code: str | None,
    typed: str = "",
    redis: str = "running",
) -> Refusing:
    """`shell.run` with every request refused by `exc`: `code` as `-c`, or None: the lines
    `typed` on a piped stdin (Python's console). The context, with the URLs it was asked."""
    ctx = Refusing(exc)
    monkeypatch.setattr(shell, "spec_for", lambda s, t: sites.get_endpoint("testsite.local.detail"))
    monkeypatch.setattr(shell.procs, "ensure_redis", lambda s: redis)
    monkeypatch.setattr(shell, "context", lambda *a, **kw: ctx)
    monkeypatch.setattr("sys.stdin", io.StringIO(typed))
    monkeypatch.setattr("sys.displayhook", sys.displayhook)  # the session replaces it
    ctx.status = shell.run(URL, site="testsite", command=code)
    return ctx


def test_reading_resp_after_a_robots_block_says_why_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = RobotsDisallowed(f"robots.txt disallows {URL}", url=URL, user_agent="chaincrawl")
    assert run_with(monkeypatch, blocked, "print(resp.css('h1::text').get())").status == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "AttributeError" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith(
        f"error: resp is None: robots.txt disallows GET {URL} for user agent 'chaincrawl'; "
    ), last
    assert "./control.sh limits" in last and "./control.sh parse TASK" in last
    assert "CHAINCRAWL_ROBOTS_IGNORE=testsite skips robots.txt for the site" in last


def test_a_failed_fetch_is_named_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_with(monkeypatch, FetchError("connection refused"), "resp.status").status == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        f"error: resp is None: GET {URL} failed (FetchError: connection refused)"
    )


def test_a_bug_of_the_code_itself_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = RobotsDisallowed("no", url=URL, user_agent="chaincrawl")
    assert run_with(monkeypatch, blocked, "undefined_name").status == 1
    assert "NameError" in capsys.readouterr().err


def test_the_interactive_session_says_why_resp_is_none_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Typed in the session (stdin piped: Python's console), `resp.css(...)` after the fetch
    failed is the same one line, and the session goes on; a bug of the line typed keeps its
    traceback. `fetch("/other")` then resolves against the URL asked before."""
    typed = 'resp.css("h1")\nfetch("/other")\nresp.status\nundefined_name\n'
    ctx = run_with(monkeypatch, FetchError("connection refused"), None, typed)
    assert ctx.status == 0
    err = capsys.readouterr().err
    why = f"error: resp is None: GET {URL} failed (FetchError: connection refused)"
    assert why in err and "AttributeError" not in err, err
    assert ctx.asked == [URL, "http://127.0.0.1:9/other"]
    assert "NameError" in err and err.count("Traceback") == 1, err


def test_the_embedded_redis_started_for_it_is_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `parse` says it: a first command of a fresh clone otherwise paused without a word."""
    run_with(monkeypatch, FetchError("refused"), "pass", redis="started")
    assert capsys.readouterr().err.startswith("redis: started the embedded Redis\n")
    run_with(monkeypatch, FetchError("refused"), "pass")
    assert "redis:" not in capsys.readouterr().err
