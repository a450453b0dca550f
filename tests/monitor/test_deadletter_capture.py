"""A failed render's screenshot and DOM in its dead letter: written under VAR_DIR/captures,
named in the record, bounded in size and number, removed with the letter, shown by
`deadletter list -v`. (A real page's capture: tests/integration/test_render_failures.py.)"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import redis
from rich.console import Console

from cli import deadletter as cli_deadletter
from config import Settings
from exceptions import BrowserCrashed, FetchTimeout, RenderTimeout
from monitor.deadletter import DeadLetter, DeadLetterStore, drop_capture, keep_capture
from settings.browser import BrowserSettings

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 100


def failed_render(dom: str = "<html><p id='hang'>loading</p></html>") -> RenderTimeout:
    exc = RenderTimeout("http://127.0.0.1:1/js/hang: the page did not settle")
    exc.attach(page_url="http://127.0.0.1:1/js/hang", screenshot=PNG, dom=dom)
    return exc


def letter(dl_id: str, capture: dict | None) -> DeadLetter:
    return DeadLetter(id=dl_id, task="demo.js.page", params={}, meta={}, error_type="RenderTimeout",
                      error="did not settle", traceback="tb", retries=1, capture=capture)  # fmt: skip


def test_the_capture_is_written_and_the_record_names_it(tmp_path: Path) -> None:
    cap = keep_capture(failed_render(), "t1", tmp_path, BrowserSettings())
    assert cap is not None
    where = tmp_path / "captures" / "t1"
    assert cap["dir"] == str(where) and cap["host"] == socket.gethostname()
    assert cap["page_url"] == "http://127.0.0.1:1/js/hang"
    assert (where / "screenshot.png").read_bytes() == PNG
    assert "id='hang'" in (where / "dom.html").read_text()
    assert cap["files"] == {"screenshot.png": len(PNG), "dom.html": 37}


def test_no_capture_without_one_or_with_captures_off(tmp_path: Path) -> None:
    assert keep_capture(FetchTimeout("plain fetch"), "t1", tmp_path) is None
    assert keep_capture(BrowserCrashed("no page to show"), "t1", tmp_path) is None
    off = BrowserSettings(captures=0)
    assert keep_capture(failed_render(), "t1", tmp_path, off) is None
    assert not (tmp_path / "captures").exists()


def test_sizes_are_capped(tmp_path: Path) -> None:
    b = BrowserSettings(capture_max_kb=1)
    cap = keep_capture(failed_render("x" * 5000), "t1", tmp_path, b)
    assert cap is not None
    assert cap["files"]["dom.html"] == 1024 and cap["dom_cut_from"] == 5000
    exc = failed_render()
    exc.screenshot = b"\x89PNG" + b"\x00" * 2000
    cap = keep_capture(exc, "t2", tmp_path, b)
    assert cap is not None
    assert "screenshot.png" not in cap["files"] and cap["screenshot_left_out"] == 2004


def test_only_the_newest_captures_are_kept(tmp_path: Path) -> None:
    b = BrowserSettings(captures=3)
    past = time.time() - 100
    for i in range(5):
        keep_capture(failed_render(), f"t{i}", tmp_path, b)
        os.utime(tmp_path / "captures" / f"t{i}", (past + i, past + i))  # one a second
    assert sorted(p.name for p in (tmp_path / "captures").iterdir()) == ["t2", "t3", "t4"]


def test_a_disk_that_refuses_is_noted_never_raised(tmp_path: Path) -> None:
    (tmp_path / "captures").write_text("a file where the directory should be")
    cap = keep_capture(failed_render(), "t1", tmp_path)
    assert cap is not None and "error" in cap and not cap["files"]


def test_removing_the_letter_removes_its_capture(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    store = DeadLetterStore(client, Settings(redis_url=redis_url, key_prefix=key_prefix))
    store.add(letter("t1", keep_capture(failed_render(), "t1", tmp_path)))
    dl = store.get("t1")
    assert dl is not None and dl.capture is not None
    assert dl.capture["files"]["screenshot.png"] == len(PNG)  # round trip
    assert (tmp_path / "captures" / "t1").is_dir()
    assert store.remove("t1")
    assert not (tmp_path / "captures" / "t1").exists()
    # another machine's capture, or a path outside a captures directory, is left alone
    elsewhere = {"dir": str(tmp_path), "host": "another-host", "files": {}}
    drop_capture(letter("t2", elsewhere))
    drop_capture(letter("t3", {**elsewhere, "host": socket.gethostname()}))
    assert tmp_path.is_dir()
    client.close()


def test_list_verbose_says_where_the_capture_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = keep_capture(failed_render(), "t1", tmp_path)

    class Store:
        def __init__(self, r: object) -> None: ...

        def list(self, *a: object) -> list[DeadLetter]:
            return [letter("t1", cap), letter("t2", None)]

        def count(self) -> int:
            return 2

    monkeypatch.setattr(cli_deadletter, "DeadLetterStore", Store)
    monkeypatch.setattr(cli_deadletter, "get_redis", lambda: None)
    monkeypatch.setattr(cli_deadletter, "Console", lambda: Console(width=200))
    assert cli_deadletter.list_view(verbose=True) == 2
    out = capsys.readouterr().out
    assert f"page capture of http://127.0.0.1:1/js/hang on host {socket.gethostname()}" in out
    assert str(tmp_path / "captures" / "t1" / "screenshot.png") in out
    assert str(tmp_path / "captures" / "t1" / "dom.html") in out
    assert out.count("page capture of") == 1  # t2 failed without a page to show
