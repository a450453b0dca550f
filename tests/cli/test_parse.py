"""`control.sh parse` and `control.sh shell` as a developer runs them against a live site:
JSON lines, nothing stored, the HTTP cache answering the second time, a recorded case that
replays offline, the children a chain's step would send, errors as one line."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from base_task import run_endpoint
from config import ROOT
from demo.testing import DemoServer
from external_interface.fetch.mock import load_case, outputs_of
from tests.cli.conftest import control as cli_control
from tests.polite_site import PoliteSite
from tests.testsite.server import TestSite

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    s = TestSite()
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def env(site: TestSite, redis_url: str, key_prefix: str, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TESTSITE_URL": site.url, "CHAINCRAWL_REDIS_URL": redis_url,
            "CHAINCRAWL_KEY_PREFIX": key_prefix, "CHAINCRAWL_VAR_DIR": str(tmp_path / "var"),
            "CHAINCRAWL_JSONL_DIR": str(tmp_path / "items")}  # fmt: skip


def control(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return cli_control(*args, env=env, timeout=120)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in text.splitlines()]


def test_parse_prints_json_lines_and_stores_nothing(
    site: TestSite, env: dict[str, str], rds: redis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    before = site.hits["list:2"]
    out = control("parse", "testsite.local.listing", '{"page": 2}', env=env)
    assert out.returncode == 0, out.stderr
    assert json_lines(out.stdout) == [
        *({"kind": "item", "type": "testsite.entry", "item": {"entry_id": f"e2-{i}", "n": i}}
          for i in range(4)),
        {"kind": "follow", "params": {"page": 3, "per": None}},
    ]  # fmt: skip
    assert f"GET {site.url}/list?page=2 -> 200" in out.stderr
    assert "4 item(s) (testsite.entry), 1 follow-up(s); 1 request(s)" in out.stderr
    assert site.hits["list:2"] == before + 1
    assert rds.keys(f"{key_prefix}*") == []  # no run, no outbox, no counters, no metrics
    assert not (tmp_path / "items").exists()


def test_a_page_that_yields_no_item_gets_a_note_naming_shell(
    site: TestSite, env: dict[str, str]
) -> None:
    """The new endpoint's guessed selectors match nothing: "0 item(s)" alone, exit 0, read as
    success; the note names the command that tries selectors on that page."""
    out = control("parse", "testsite.local.listing", '{"page": 3, "per": 0}', env=env)
    assert out.returncode == 0, out.stderr
    assert "0 item(s), 0 follow-up(s)" in out.stderr
    assert (
        "note: no item from a page that answered: do the selectors match it? Try them on the "
        f"page as the endpoint gets it: ./control.sh shell '{site.url}/list?page=3&per=0' "
        "--task testsite.local.listing"
    ) in out.stderr
    full = control("parse", "testsite.local.listing", '{"page": 2}', env=env)
    assert "note: no item" not in full.stderr


def test_the_http_cache_answers_the_second_parse(
    site: TestSite, env: dict[str, str], tmp_path: Path
) -> None:
    env = {**env, "CHAINCRAWL_HTTP_CACHE": str(tmp_path / "cache")}
    first = control("parse", "testsite.local.detail", '{"entry_id": "c1"}', env=env)
    assert first.returncode == 0 and site.hits["detail:c1"] == 1, first.stderr
    second = control("parse", "testsite.local.detail", '{"entry_id": "c1"}', env=env)
    assert second.returncode == 0, second.stderr
    assert site.hits["detail:c1"] == 1  # no request reached the site
    assert (
        "-> 200 (from the HTTP cache)" in second.stderr and "1 from the HTTP cache" in second.stderr
    )
    assert second.stdout == first.stdout
    unset = control(
        "parse",
        "testsite.local.detail",
        '{"entry_id": "c1"}',
        env=dict(env, CHAINCRAWL_HTTP_CACHE=""),
    )
    assert unset.returncode == 0 and site.hits["detail:c1"] == 2  # unset: never used


def test_a_recorded_case_replays_offline(
    site: TestSite, env: dict[str, str], tmp_path: Path
) -> None:
    folder = tmp_path / "fixtures" / "listing"
    out = control("parse", "testsite.local.listing", '{"page": 3, "per": 2}', "--save-fixture",
                  "--fixture-dir", str(folder), env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"recorded 1 answer(s) in {folder}/ (case.json, 1.json)" in out.stderr
    case = load_case(folder)
    assert (case.task, case.params) == ("testsite.local.listing", {"page": 3, "per": 2})
    assert [(a.method, a.status) for a in case.answers] == [("GET", 200)]
    hits = sum(site.hits.values())
    fetcher = case.fetcher()
    items, follows = run_endpoint(case.task, case.params, fetcher)
    assert sum(site.hits.values()) == hits  # offline: the site saw nothing
    assert outputs_of(items, follows) == case.outputs
    assert [i.model_dump() for i in items] == [
        {"entry_id": "e3-0", "n": 0},
        {"entry_id": "e3-1", "n": 1},
    ]
    assert follows == []  # page 3 is the last
    with pytest.raises(Exception, match="no recorded answer for GET"):
        run_endpoint(case.task, {"page": 1}, case.fetcher())


def test_children_of_a_chain_step(tmp_path: Path, env: dict[str, str]) -> None:
    with DemoServer(size="tiny", features=[]) as demo:
        out = control("parse", "demo.h5.feed", "{}", "--chain", "demo_social",
                      env=dict(env, DEMO_BASE_URL=demo.url))  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = json_lines(out.stdout)
    kids = [x for x in lines if x["kind"] == "child"]
    entries = [x["item"] for x in lines if x["kind"] == "item"]
    assert entries and kids
    assert {k["task"] for k in kids} >= {"demo.h5.user_info", "demo.h5.user_statuses"}
    users = {e["user_id"] for e in entries}
    assert {k["params"]["user_id"] for k in kids if k["task"] == "demo.h5.user_info"} == users
    assert "child task(s) of step" in out.stderr
    wrong = control(
        "parse", "demo.h5.feed", "{}", "--chain", "demo_social", "--step", "nope", env=env
    )
    assert wrong.returncode == 2 and "has no step 'nope'" in wrong.stderr


def test_errors_are_one_line(site: TestSite, env: dict[str, str]) -> None:
    bad = control("parse", "testsite.local.listing", "{page: 1}", env=env)
    assert bad.returncode == 2 and "PARAMS is not valid JSON" in bad.stderr
    wrong = control("parse", "testsite.local.listing", '{"page": "x"}', env=env)
    assert wrong.returncode == 2 and "field 'page'" in wrong.stderr
    missing = control("parse", "testsite.local.probe", '{"path": "/status/404"}', "--save-fixture",
                      "--fixture-dir", "/nonexistent/never", env=env)  # fmt: skip
    assert missing.returncode == 1
    assert "error: testsite.local.probe raised NotFound" in missing.stderr
    assert "nothing recorded" in missing.stderr and "Traceback" not in missing.stderr


def test_a_site_that_does_not_answer_gets_a_hint_on_robots_txt(env: dict[str, str]) -> None:
    """Nothing listens at the site's address: the page waits on its robots.txt, which every
    process then keeps for a few seconds (CHAINCRAWL_ROBOTS_UNREACHABLE_TTL); parse says what
    to look at and how to skip robots.txt while developing, not only 'RobotsUnavailable'."""
    down = control(
        "parse",
        "testsite.local.listing",
        env={
            **env,
            "TESTSITE_URL": "http://127.0.0.1:1",
            "CHAINCRAWL_ROBOTS": "1",
            "CHAINCRAWL_ROBOTS_IGNORE": "",
        },
    )
    assert down.returncode == 1, down.stderr
    assert "raised RobotsUnavailable: robots.txt of http://127.0.0.1:1 unreadable" in down.stderr
    assert "hint: no request goes to a site whose robots.txt could not be read" in down.stderr
    assert "is the site up at that address?" in down.stderr
    assert "next try in 5s" in down.stderr  # no answer: asked again soon, not in 10 minutes
    assert "CHAINCRAWL_ROBOTS_UNREACHABLE_TTL (5s" in down.stderr
    assert "CHAINCRAWL_ROBOTS_IGNORE=testsite skips robots.txt for the site" in down.stderr


def test_shell_fetches_as_the_site_and_runs_code(site: TestSite, env: dict[str, str]) -> None:
    code = "print(resp.json()['title']); r = fetch('e7'); print(r.json()['title'], resp is r)"
    out = control("shell", f"{site.url}/detail/e6", "--site", "testsite", "-c", code, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["Title e6", "Title e7 True"]
    assert f"GET {site.url}/detail/e7 -> 200" in out.stderr  # relative to the page shown
    gone = control("shell", f"{site.url}/status/404", "-c", "print(resp.status)", env=env)
    assert gone.stdout.strip() == "404"  # an error page is shown, not raised
    console = subprocess.run([str(ROOT / "control.sh"), "shell", f"{site.url}/list"], cwd=ROOT,
                             env=env, input="len(resp.json()['entries'])\n", capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert console.returncode == 0 and "4" in console.stdout, console.stderr
    assert "fetch(url, **kw)" in console.stderr
    unknown = control("shell", site.url, "--site", "testsit", env=env)
    assert unknown.returncode == 2 and "did you mean 'testsite'" in unknown.stderr


def test_shell_fetch_echoes_one_line_and_a_blocked_fetch_clears_resp(
    site: TestSite, env: dict[str, str]
) -> None:
    """In the console, `fetch(url)` is said once (its summary line), `resp` echoes as one line,
    never the dataclass's whole repr with the body; a page robots.txt forbids leaves `resp`
    None (not the page before it, which selectors tried next would read) and says why."""
    console = subprocess.run([str(ROOT / "control.sh"), "shell", f"{site.url}/list"], cwd=ROOT,
                             env=env, input="fetch('/detail/e7')\nresp\n", capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert console.returncode == 0, console.stderr
    assert "Response(url=" not in console.stdout and "b'" not in console.stdout
    echoed = [line for line in console.stdout.splitlines() if "<Response" in line]
    assert len(echoed) == 1 and f"<Response 200 {site.url}/detail/e7 (" in echoed[0], echoed
    assert f"GET {site.url}/detail/e7 -> 200" in console.stderr
    polite = PoliteSite().start()
    try:
        penv = {**env, "CHAINCRAWL_EXTRA_SITE_PACKAGES": "tests.politesite",
                "POLITESITE_URL": polite.url, "CHAINCRAWL_ROBOTS": "on"}  # fmt: skip
        code = "print(resp.status); fetch('/private/page'); print(resp)"
        out = control("shell", f"{polite.url}/robots.txt", "--site", "politesite", "-c", code,
                      env=penv)  # fmt: skip
    finally:
        polite.stop()
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["200", "None"]
    assert f"GET {polite.url}/private/page blocked by robots.txt" in out.stderr


def test_items_dropped_by_a_hook_are_said_so_not_blamed_on_the_selectors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A page whose one item a before_store hook skipped: parse names the hook's reason and
    does not suggest that the selectors found nothing."""
    from cli import parse
    from external_interface.fetch import FetchRequest, Response
    from lifecycle.live import LiveResult
    from sites import get_endpoint

    spec = get_endpoint("testsite.local.detail")
    url = "http://127.0.0.1:9/detail/e1"
    answer = Response(url=url, status=200, headers={}, content=b"{}", elapsed=0.0)
    result = LiveResult(spec, {"entry_id": "e1"}, exchanges=[(FetchRequest("GET", url), answer)])
    result.dropped = {"odd": 1}
    monkeypatch.setattr(parse.procs, "ensure_redis", lambda s: "running")
    monkeypatch.setattr(parse, "run_live", lambda *a, **kw: result)
    assert parse.run("testsite.local.detail", {"entry_id": "e1"}) == 0
    err = capsys.readouterr().err
    assert "0 item(s)" in err and "dropped by before_store hooks: odd 1" in err
    assert "do the selectors match it?" not in err
    result.dropped = {}
    assert parse.run("testsite.local.detail", {"entry_id": "e1"}) == 0
    assert "do the selectors match it?" in capsys.readouterr().err  # nothing at all: the note
