"""The browser pool's parts that need no browser: requests, frames, error mapping, /proc."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from config import ROOT
from exceptions import (
    BrowserCrashed,
    ConnectError,
    FetchTimeout,
    ParseError,
    Policy,
    ProxyError,
    RenderError,
    RenderTimeout,
    ResourceUnavailable,
    TooManyRedirects,
    TransportError,
    policy_for,
)
from external_interface.browser import (
    Click,
    LoadMore,
    PoolConfig,
    RenderRequest,
    ScrollToEnd,
    Wait,
    WaitFor,
    check,
    procmem,
    wire,
)
from external_interface.browser.model import action_from_wire, proxy_parts, result_from_wire
from external_interface.browser.pool import _error, auto_contexts, net_error
from settings.browser import BrowserSettings


def test_request_fills_the_pools_defaults_and_keeps_secrets_out_of_repr() -> None:
    req = RenderRequest(
        "http://127.0.0.1:1/js/more",
        wait_for=".feed-item",
        actions=[LoadMore("button.load-more", item=".feed-item"), Wait(10)],
        proxy="http://user:s3cret@127.0.0.9:8080",
        cookies={"session": "tok3n"},
        user_agent="Mozilla/5.0 X",
    )
    msg = req.to_wire(default_timeout=12.5, default_block=("image",))
    assert msg["timeout"] == 12.5 and msg["block"] == ["image"]
    assert msg["proxy"] == {
        "server": "http://127.0.0.9:8080",
        "username": "user",
        "password": "s3cret",
    }
    assert msg["actions"][0] == {
        "kind": "load_more", "selector": "button.load-more", "item": ".feed-item",
        "max_clicks": 100, "settle_ms": 5000,
    }  # fmt: skip
    assert [action_from_wire(a) for a in msg["actions"]] == list(req.actions)
    text = repr(req)
    assert "s3cret" not in text and "tok3n" not in text and "user:" not in text
    assert RenderRequest("http://h/", timeout=3, block=()).to_wire(9, ("image",))["block"] == []


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"url": "ftp://h/x"}, "absolute http(s) URL"),
        ({"url": "/relative"}, "absolute http(s) URL"),
        ({"url": "http://h/", "timeout": 0}, "timeout must be > 0"),
        ({"url": "http://h/", "wait_until": "idle"}, "wait_until must be one of"),
        ({"url": "http://h/", "capture_json": "("}, "capture_json is not a valid regular"),
        ({"url": "http://h/", "block": ["images"]}, "unknown resource types ['images']"),
        ({"url": "http://h/", "actions": [Click("")]}, "click: selector must be a non-empty"),
        ({"url": "http://h/", "actions": [ScrollToEnd(max_rounds=-1)]}, "max_rounds must be"),
        ({"url": "http://h/", "proxy": "ftp://p:1"}, "proxy must be scheme://host:port"),
        ({"url": "http://h/", "wait_for": " "}, "wait_for must be a non-empty"),
    ],
)
def test_bad_requests_name_what_is_wrong(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        RenderRequest(**kwargs)


def test_actions_must_be_actions_and_unknown_kinds_are_refused() -> None:
    with pytest.raises(TypeError, match="actions must be Click, WaitFor"):
        RenderRequest("http://h/", actions=["click .x"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="unknown action kind 'hover'"):
        action_from_wire({"kind": "hover", "selector": "a"})
    assert action_from_wire(WaitFor("#x", state="attached").to_wire()) == WaitFor("#x", "attached")


def test_proxy_parts_split_credentials_out_of_the_server() -> None:
    assert proxy_parts("127.0.0.2:3128") == {"server": "http://127.0.0.2:3128"}
    assert proxy_parts("socks5://[::1]:1080") == {"server": "socks5://[::1]:1080"}
    assert proxy_parts("http://a%40b:p%3Aw@h:1") == {
        "server": "http://h:1", "username": "a@b", "password": "p:w",
    }  # fmt: skip
    with pytest.raises(ValueError, match="port is not a number"):
        proxy_parts("http://h:port")


def test_result_from_wire_gives_fetch_responses() -> None:
    dom = '<html><body><div class="x">渲染</div></body></html>'.encode()
    header: dict[str, Any] = {
        "ok": True,
        "page": {
            "url": "http://h/p",
            "status": 200,
            "headers": {"content-type": "text/html"},
            "history": ["http://h/old"],
            "blob": 0,
        },
        "captured": [{"url": "http://h/api", "status": 200, "headers": {}, "blob": 1}],
        "steps": [{"action": "load_more", "clicks": 2, "complete": True}],
        "elapsed": 0.25,
    }
    res = result_from_wire(header, [dom, b'{"list": [1, 2]}'])
    assert res.response.css(".x::text").get() == "渲染" and res.response.history == ["http://h/old"]
    assert res.json_answers() == [{"list": [1, 2]}] and res.steps[0]["clicks"] == 2
    bad = result_from_wire({**header, "captured": [{**header["captured"][0], "blob": 0}]}, [dom])
    with pytest.raises(ParseError):
        bad.json_answers()


def test_frames_round_trip_over_a_socket() -> None:
    a, b = socket.socketpair()
    with a, b:
        big = os.urandom(3 * 1024 * 1024)
        sender = threading.Thread(
            target=wire.send, args=(a, {"op": "x", "n": [1, "二"]}, [b"", big])
        )
        sender.start()
        header, blobs = wire.recv(b)
        sender.join()
        assert header == {"op": "x", "n": [1, "二"]} and blobs == [b"", big]
        a.sendall(b"\x00\x00\x00\x05{}")
        a.close()
        with pytest.raises(wire.WireError, match="connection closed"):
            wire.recv(b)
    c, d = socket.socketpair()
    with c, d:
        c.sendall(b"\x00\x00\x00\x02[]")
        with pytest.raises(wire.WireError, match="not a JSON object"):
            wire.recv(d)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        ("ERR_PROXY_CONNECTION_FAILED", ProxyError),
        ("ERR_TUNNEL_CONNECTION_FAILED", ProxyError),
        ("ERR_SOCKS_CONNECTION_FAILED", ProxyError),
        ("ERR_CONNECTION_REFUSED", ConnectError),
        ("ERR_NAME_NOT_RESOLVED", ConnectError),
        ("ERR_TIMED_OUT", FetchTimeout),
        ("ERR_TOO_MANY_REDIRECTS", TooManyRedirects),
        ("ERR_EMPTY_RESPONSE", TransportError),
    ],
)
def test_chromium_network_errors_map_to_the_fetch_layers_errors(code: str, cls: type) -> None:
    exc = net_error(code, "http://h/")
    assert type(exc) is cls and code in str(exc)


def test_error_replies_become_typed_errors_with_the_pages_capture() -> None:
    png = b"\x89PNG\r\n\x1a\n..."
    header = {"ok": False, "kind": "timeout", "message": "u: never settled",
              "capture": {"url": "http://h/hang", "screenshot": 0, "dom": 1}}  # fmt: skip
    exc = _error(header, [png, "<p>加载</p>".encode()], "http://h/hang")
    assert isinstance(exc, RenderTimeout) and isinstance(exc, FetchTimeout)
    assert exc.screenshot == png and exc.dom == "<p>加载</p>" and exc.page_url == "http://h/hang"
    assert policy_for(exc) is Policy.RETRY
    crashed = _error({"ok": False, "kind": "crashed", "message": "gone"}, [], "u")
    assert isinstance(crashed, BrowserCrashed) and policy_for(crashed) is Policy.RETRY
    assert crashed.screenshot is None
    busy = _error({"ok": False, "kind": "busy", "message": "all busy"}, [], "u")
    assert isinstance(busy, ResourceUnavailable) and policy_for(busy) is Policy.WAIT
    other = _error({"ok": False, "kind": "error", "message": "bad selector"}, [], "u")
    assert isinstance(other, RenderError) and policy_for(other) is Policy.RETRY
    assert isinstance(
        _error({"kind": "net", "message": "ERR_CONNECTION_RESET"}, [], "u"), ConnectError
    )
    assert isinstance(_error({"kind": "bad_request", "message": "x"}, [], "u"), ValueError)


def test_pool_config_reads_the_settings_and_sizes_itself() -> None:
    cfg = PoolConfig.from_settings(
        BrowserSettings(contexts=3, block="image, media", args="--lang=zh-CN -x")
    )
    assert (
        cfg.contexts == 3 and cfg.block == ("image", "media") and cfg.args == ("--lang=zh-CN", "-x")
    )
    assert cfg.memory_mb == 512 + 256 * 3
    assert PoolConfig.from_settings(BrowserSettings(memory_mb=999)).memory_mb == 999
    with pytest.raises(ValueError, match="CHAINCRAWL_BROWSER_BLOCK: unknown resource types"):
        PoolConfig.from_settings(BrowserSettings(block="pictures"))
    assert auto_contexts(cores=2, memory_mb=20000) == 2
    assert auto_contexts(cores=16, memory_mb=20000) == 8
    assert auto_contexts(cores=8, memory_mb=1500) == 2
    assert auto_contexts(cores=4, memory_mb=100) == 1


def test_check_names_what_to_install(tmp_path) -> None:
    found = check.problems(str(tmp_path / "no-such-chromium"))
    assert any(
        "apt-get install chromium" in p and "CHAINCRAWL_BROWSER_EXECUTABLE" in p for p in found
    )
    assert check.find_executable("/bin/sh") == "/bin/sh"
    assert check.find_executable(str(tmp_path)) is None


def test_procmem_sees_a_process_tree_and_its_memory() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess,sys,time; "
            "p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(30)', '--marker-' + 'xyz']); "
            "time.sleep(30)",
        ],
    )
    try:
        deadline = time.monotonic() + 10
        while not procmem.descendants(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        below = procmem.descendants(child.pid)
        assert len(below) == 1 and child.pid in procmem.descendants(os.getpid())
        assert procmem.pids_with_arg("--marker-xyz") == below
        assert procmem.memory_kb(child.pid) > 1000
        assert procmem.tree_memory_mb(child.pid) > procmem.memory_kb(child.pid) / 1024
    finally:
        procmem.kill([*procmem.descendants(child.pid), child.pid])
        child.wait()
    assert procmem.memory_kb(child.pid) == 0


def test_importing_the_package_never_loads_playwright() -> None:
    code = (
        "import sys, external_interface.browser as b, external_interface.browser.driver; "
        "b.RenderRequest('http://h/'); sys.exit('playwright' in sys.modules)"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_the_check_command_says_what_to_install() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CHAINCRAWL_BROWSER_EXECUTABLE": "/nonexistent/chromium",
    }
    done = subprocess.run(
        [sys.executable, "-m", "external_interface.browser"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "apt-get install chromium" in done.stderr
    bad = subprocess.run(
        [str(ROOT / "control.sh"), "setup", "--browsr"], cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "usage: control.sh setup [-h] [--browser]" in bad.stderr
    assert "did you mean --browser?" in bad.stderr
