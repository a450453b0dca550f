"""`control.sh shell -c CODE` after a fetch that got no page: CODE reading `resp` (None) ends
in one line that says why (robots.txt, with how to check or override it), not a traceback."""

from __future__ import annotations

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

    def request(self, method: str, url: str, **kw: Any) -> None:
        raise self.exc


def run_with(monkeypatch: pytest.MonkeyPatch, exc: Exception, code: str) -> int:
    monkeypatch.setattr(shell, "spec_for", lambda s, t: sites.get_endpoint("testsite.local.detail"))
    monkeypatch.setattr(shell.procs, "ensure_redis", lambda s: "running")
    monkeypatch.setattr(shell, "context", lambda *a, **kw: Refusing(exc))
    return shell.run(URL, site="testsite", command=code)


def test_reading_resp_after_a_robots_block_says_why_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = RobotsDisallowed(f"robots.txt disallows {URL}", url=URL, user_agent="chaincrawl")
    assert run_with(monkeypatch, blocked, "print(resp.css('h1::text').get())") == 1
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
    assert run_with(monkeypatch, FetchError("connection refused"), "resp.status") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        f"error: resp is None: GET {URL} failed (FetchError: connection refused)"
    )


def test_a_bug_of_the_code_itself_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = RobotsDisallowed("no", url=URL, user_agent="chaincrawl")
    assert run_with(monkeypatch, blocked, "undefined_name") == 1
    assert "NameError" in capsys.readouterr().err
