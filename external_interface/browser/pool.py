"""The worker side of rendering: one `BrowserPool` per worker process, and its driver process.

`get_pool().render(RenderRequest(url, wait_for=..., actions=...))` returns a `RenderResult`
whose `response` is a `fetch.Response` of the rendered DOM. The pool starts its driver
(driver.py: Playwright and Chromium in a process of their own) on the first render, and a new
one whenever the old one is gone; it never imports Playwright itself. A driver that served no
call for `idle_close` seconds is stopped (with Playwright's Node.js and Chromium) by a watcher
thread (a greenlet under gevent) and the next render starts a new one.

Each render opens its own connection to the driver's private Unix socket, sends one request
and reads one answer. Nothing is shared between renders on the worker side but the driver's
address, so the pool is safe from any number of threads (threads pool) or greenlets (gevent
pool: the socket, the sleeps and the lock are the patched, cooperative ones). The driver holds
the deadline itself (a page that never settles is closed and answered as a timeout, with its
screenshot and DOM); the pool waits `timeout + ANSWER_GRACE` for that answer, and a driver
that misses even that is killed and replaced.

Failures become the project's errors (exceptions.py): `RenderTimeout` (retry, with the page's
capture; `SelectorTimeout`, never retried, when a selector never came on a loaded, quiet
page), `InvalidSelector` (never retried: found before the page loads), `BrowserCrashed` (retry; the next render gets a new browser, or a new driver),
`ConnectError`/`ProxyError`/`FetchTimeout` for network errors as the fetch layer raises them,
`ResourceUnavailable` when every context stayed busy for `queue_wait` (re-queued, not failed),
`BrowserUnavailable` when no browser can start here (fail, with what to install).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config import ROOT
from exceptions import (
    BrowserCrashed,
    BrowserUnavailable,
    ConnectError,
    FetchTimeout,
    InvalidSelector,
    PageCapture,
    ProxyError,
    RenderError,
    RenderTimeout,
    ResourceUnavailable,
    SelectorTimeout,
    TooManyRedirects,
    TransportError,
)
from external_interface.browser import procmem, wire
from external_interface.browser.check import find_executable, problems
from external_interface.browser.model import (
    RESOURCE_TYPES,
    RenderRequest,
    RenderResult,
    result_from_wire,
)
from settings.browser import BrowserSettings, get_browser_settings

REPO_ROOT = ROOT
ANSWER_GRACE = 10.0  # a failing page's capture and close come after its deadline
BUSY_RETRY_AFTER = 1.0
MAX_CONTEXTS_AUTO = 8
MB_PER_CONTEXT_AUTO = 512  # memory available per context before the auto size counts fewer
_MAKING = threading.Lock()


@dataclass(frozen=True)
class PoolConfig:
    """The pool's sizes and defaults; `from_settings` reads the CHAINCRAWL_BROWSER_* fields."""

    executable: str
    contexts: int
    context_pages: int
    memory_mb: int
    timeout: float
    queue_wait: float
    block: tuple[str, ...]
    args: tuple[str, ...] = ()
    start_timeout: float = 30.0
    answer_grace: float = ANSWER_GRACE  # how long past its deadline a render's answer may take
    idle_close: float = 60.0  # seconds without a render before the driver is stopped; 0: never

    @classmethod
    def from_settings(cls, s: BrowserSettings | None = None) -> PoolConfig:
        s = s or get_browser_settings()
        block = tuple(t.strip() for t in s.block.split(",") if t.strip())
        unknown = set(block) - RESOURCE_TYPES
        if unknown:
            raise ValueError(
                f"CHAINCRAWL_BROWSER_BLOCK: unknown resource types {sorted(unknown)}; "
                f"known: {', '.join(sorted(RESOURCE_TYPES))}"
            )
        contexts = s.contexts or auto_contexts()
        return cls(
            executable=find_executable(s.executable) or s.executable,
            contexts=contexts,
            context_pages=s.context_pages,
            memory_mb=s.memory_mb or auto_memory_mb(contexts),
            timeout=s.timeout,
            queue_wait=s.queue_wait,
            block=block,
            args=tuple(s.args.split()),
            idle_close=s.idle_close,
        )


def available_memory_mb() -> int:
    """MemAvailable from /proc/meminfo (what can be used without swapping); 0 if unknown."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def auto_contexts(cores: int | None = None, memory_mb: int | None = None) -> int:
    """One context per core (rendering is CPU-bound), fewer when each would get less than
    MB_PER_CONTEXT_AUTO of the available memory, at least 1, at most MAX_CONTEXTS_AUTO."""
    cores = cores or os.cpu_count() or 1
    memory_mb = available_memory_mb() if memory_mb is None else memory_mb
    by_memory = memory_mb // MB_PER_CONTEXT_AUTO if memory_mb else cores
    return max(1, min(cores, by_memory, MAX_CONTEXTS_AUTO))


def auto_memory_mb(contexts: int) -> int:
    """The default ceiling on the browser's tree: its own processes (browser, zygotes, GPU,
    network and storage services: ~330 MB PSS measured on the demo) plus a renderer per
    context (~130-200 MB on the demo's pages, more on heavy sites), with headroom."""
    return 512 + 256 * contexts


class BrowserPool:
    """Renders pages for this worker process through its driver process (see the module doc)."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock_: threading.Lock | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._busy = 0  # renders and stats calls in flight
        self._last_used = time.monotonic()
        self.driver_starts = 0
        self.idle_closes = 0

    @property
    def _lock(self) -> threading.Lock:
        """Made at first use, so a pool built before gevent patched `threading` still gets a
        cooperative lock (a real one held across the driver's start would block the hub)."""
        if self._lock_ is None:
            with _MAKING:  # held for an instant, never across a switch
                if self._lock_ is None:
                    self._lock_ = threading.Lock()
        return self._lock_

    # --- public ---------------------------------------------------------------------------
    def render(self, request: RenderRequest) -> RenderResult:
        """Render one page; raises the errors listed in the module doc."""
        msg = request.to_wire(self.config.timeout, self.config.block)
        header, blobs = self._call(
            msg, float(msg["timeout"]) + self.config.answer_grace, request.url
        )
        if header.get("ok"):
            return result_from_wire(header, blobs)
        raise _error(header, blobs, request.url)

    def stats(self) -> dict[str, Any]:
        """The driver's counters: contexts, memory (MB, PSS), renders, errors, restarts."""
        header, _ = self._call({"op": "stats"}, 30.0, "stats")
        return dict(header.get("stats") or {})

    @property
    def driver_pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def driver_dir(self) -> Path | None:
        """The driver's private directory (its socket, log, and Chromium's profile)."""
        return self._dir

    def close(self) -> None:
        """Stop the driver (it closes Chromium) and remove its private directory."""
        if os.getpid() != self._pid or self._proc is None:
            return  # never started, or a forked child: the driver is the parent's
        with self._lock:
            self._stop_driver(graceful=True)

    # --- the driver process ---------------------------------------------------------------
    def _ensure(self) -> Path:
        """The driver's socket (a driver started if none runs), counted as in use until
        `_done`: the idle watcher never stops a driver with a call in flight."""
        if os.getpid() != self._pid:
            self._reset()  # forked: the parent's driver stays the parent's
        with self._lock:
            if self._proc is None or self._proc.poll() is not None or self._dir is None:
                self._start_driver()
            assert self._dir is not None
            self._busy += 1
            return self._dir / "driver.sock"

    def _done(self) -> None:
        with self._lock:
            self._busy -= 1
            self._last_used = time.monotonic()

    def _watch_idle(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop `proc` once no call used it for `idle_close` seconds (a thread per driver, or a
        greenlet under gevent; it ends with its driver). The next render starts a new one."""
        idle = self.config.idle_close
        while True:
            with self._lock:
                if self._proc is not proc or proc.poll() is not None:
                    return  # replaced or gone: its successor has a watcher of its own
                quiet = time.monotonic() - self._last_used
                if self._busy == 0 and quiet >= idle:
                    self.idle_closes += 1  # counted first: whoever sees the driver gone sees it
                    self._stop_driver(graceful=True)
                    return
            time.sleep(max(0.05, min(idle - quiet if self._busy == 0 else idle, 5.0)))

    def _start_driver(self) -> None:
        self._stop_driver(graceful=False)
        missing = problems(self.config.executable)
        if missing:
            raise BrowserUnavailable("; ".join(missing))
        self._dir = Path(tempfile.mkdtemp(prefix="cc-browser-"))
        cfg = {
            "executable": self.config.executable,
            "contexts": self.config.contexts,
            "context_pages": self.config.context_pages,
            "memory_mb": self.config.memory_mb,
            "queue_wait": self.config.queue_wait,
            "args": list(self.config.args),
            "start_timeout": self.config.start_timeout,
            "socket": str(self._dir / "driver.sock"),
        }
        cfg_path = self._dir / "driver.json"
        cfg_path.write_text(json.dumps(cfg))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINCRAWL_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env["TMPDIR"] = str(self._dir)  # Playwright's fresh profile lands here: one place to clean
        with open(self._dir / "driver.log", "wb") as logf:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "external_interface.browser.driver", str(cfg_path)],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.PIPE,  # our end stays open: EOF tells the driver we are gone
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C to the worker's group is the worker's to handle
            )
        self.driver_starts += 1
        self._last_used = time.monotonic()
        if self.driver_starts == 1:
            atexit.register(self.close)
        deadline = time.monotonic() + self.config.start_timeout + 15
        sock_path = self._dir / "driver.sock"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = self._log_tail()
                self._stop_driver(graceful=False)
                raise BrowserUnavailable(f"the browser driver did not start: {log}")
            with contextlib.suppress(OSError, wire.WireError):
                if _ask(sock_path, {"op": "ping"}, 2.0)[0].get("ok"):
                    if self.config.idle_close > 0:
                        watcher = threading.Thread(
                            target=self._watch_idle,
                            args=(self._proc,),
                            daemon=True,
                            name="browser-idle-close",
                        )
                        watcher.start()
                    return
            time.sleep(0.05)
        log = self._log_tail()
        self._stop_driver(graceful=False)
        raise BrowserUnavailable(f"the browser driver was not ready in time: {log}")

    def _stop_driver(self, graceful: bool) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            if graceful and proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(15)
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        old, self._dir = self._dir, None
        if old is not None:
            procmem.kill(procmem.pids_with_arg(str(old)))  # a browser the dead driver left
            shutil.rmtree(old, ignore_errors=True)

    def _discard(self, path: Path) -> None:
        """Stop the driver behind `path`, unless another render already replaced it."""
        with self._lock:
            if self._dir is not None and path.parent == self._dir:
                self._stop_driver(graceful=False)

    def _log_tail(self) -> str:
        path = self._dir / "driver.log" if self._dir else None
        if path is None or not path.exists():
            return "(no log)"
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error:")]
        return (errors[-1] if errors else " | ".join(lines[-5:]))[:2000] or "(empty log)"

    def _call(
        self, msg: Mapping[str, Any], wait: float, url: str
    ) -> tuple[dict[str, Any], list[bytes]]:
        for attempt in (1, 2):
            path = self._ensure()
            try:
                return self._call_once(path, msg, wait, url, attempt)
            except _Again:
                continue
            finally:
                self._done()
        raise AssertionError("unreachable")

    def _call_once(
        self, path: Path, msg: Mapping[str, Any], wait: float, url: str, attempt: int
    ) -> tuple[dict[str, Any], list[bytes]]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(wait)
        try:
            try:
                sock.connect(str(path))
            except OSError:
                # nothing listens: the driver died since the last render; start a new one
                self._discard(path)
                if attempt == 1:
                    raise _Again from None
                raise BrowserCrashed(f"the browser driver is not reachable for {url}") from None
            try:
                wire.send(sock, msg)
                return wire.recv(sock)
            except TimeoutError:
                self._discard(path)  # wedged past its own deadline: replace it
                raise RenderTimeout(
                    f"{url}: the browser driver did not answer within {wait:.1f} s"
                ) from None
            except (OSError, wire.WireError) as exc:
                self._discard(path)  # it died under us: the next render starts a new one
                raise BrowserCrashed(
                    f"the browser driver went away while rendering {url}: {exc}"
                ) from None
        finally:
            sock.close()


class _Again(Exception):
    """The driver was gone before the call: try once more on a new one."""


def _ask(path: Path, msg: Mapping[str, Any], wait: float) -> tuple[dict[str, Any], list[bytes]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(wait)
        sock.connect(str(path))
        wire.send(sock, msg)
        return wire.recv(sock)


# --- errors ---------------------------------------------------------------------------------
_CONNECT = frozenset(
    (
        "ERR_CONNECTION_REFUSED",
        "ERR_CONNECTION_RESET",
        "ERR_CONNECTION_CLOSED",
        "ERR_CONNECTION_FAILED",
        "ERR_CONNECTION_ABORTED",
        "ERR_NAME_NOT_RESOLVED",
        "ERR_ADDRESS_UNREACHABLE",
        "ERR_ADDRESS_INVALID",
        "ERR_INTERNET_DISCONNECTED",
        "ERR_NETWORK_CHANGED",
        "ERR_NAME_RESOLUTION_FAILED",
    )
)
_TIMEOUT = frozenset(("ERR_TIMED_OUT", "ERR_CONNECTION_TIMED_OUT"))


def net_error(code: str, url: str) -> Exception:
    """Chromium's `net::ERR_*` code as the fetch layer's error for the same failure."""
    msg = f"{code} for {url}"
    if "PROXY" in code or "SOCKS" in code or "TUNNEL" in code:
        return ProxyError(f"proxy failed: {msg}")
    if code in _TIMEOUT:
        return FetchTimeout(msg)
    if code in _CONNECT:
        return ConnectError(f"connection failed: {msg}")
    if code == "ERR_TOO_MANY_REDIRECTS":
        return TooManyRedirects(msg)
    return TransportError(f"request failed: {msg}")


def _error(header: Mapping[str, Any], blobs: Sequence[bytes], url: str) -> Exception:
    kind = header.get("kind", "error")
    msg = str(header.get("message", ""))
    exc: Exception
    if kind == "busy":
        return ResourceUnavailable(msg, retry_after=BUSY_RETRY_AFTER)
    if kind == "bad_request":
        return ValueError(msg)
    if kind == "bad_selector":
        return InvalidSelector(msg)
    if kind == "net":
        return net_error(msg, url)
    if kind == "timeout":
        exc = RenderTimeout(msg)
    elif kind == "selector_timeout":
        exc = SelectorTimeout(msg)
    elif kind == "crashed":
        exc = BrowserCrashed(msg)
    else:
        exc = RenderError(f"{url}: {msg}")
    cap = header.get("capture")
    if cap and isinstance(exc, PageCapture):
        shot, dom = cap.get("screenshot"), cap.get("dom")
        exc.attach(
            page_url=str(cap.get("url", "")),
            screenshot=blobs[shot] if shot is not None else None,
            dom=blobs[dom].decode("utf-8", "replace") if dom is not None else None,
        )
    return exc


# --- the process's pool ---------------------------------------------------------------------
_pools: dict[int, BrowserPool] = {}


def get_pool(settings: BrowserSettings | None = None) -> BrowserPool:
    """This process's pool, made from the settings on first use (its driver starts with the
    first render). A forked child gets a pool and a driver of its own."""
    pid = os.getpid()
    pool = _pools.get(pid)
    if pool is None:
        pool = _pools.setdefault(pid, BrowserPool(PoolConfig.from_settings(settings)))
    return pool


def render(request: RenderRequest) -> RenderResult:
    """`get_pool().render(request)`."""
    return get_pool().render(request)
