"""The browser driver: the process that owns Playwright and Chromium for one worker process.

`python -m external_interface.browser.driver CONFIG.json` is started by the worker's
`BrowserPool` (pool.py) on its first render. It launches the system Chromium through
Playwright's async API on its own asyncio loop and serves renders on a private Unix socket,
one connection per render (wire.py frames). It exits when its standard input closes, so it
never outlives the worker, and it closes Chromium on the way out.

Why a process of its own rather than Playwright inside the worker (measured with Playwright
1.65, gevent 26, Python 3.11): Playwright's sync API on a gevent worker renders from one
greenlet, but two greenlets rendering at once fail with `InvalidSwitchError` (its dispatcher
greenlet switches into gevent's hub); its async API in a real OS thread of a gevent-patched
process fails at launch (asyncio's subprocess support wants the main thread's loop, and
gevent's patched `threading` breaks its bookkeeping); on the threads pool the sync API belongs
to the thread that started it, so each thread would start a Chromium of its own. An unpatched
process running the async API has none of these problems and the same client works on every
pool: the worker side only opens a socket per render, which gevent makes cooperative and the
threads pool simply blocks on. It also isolates: a Chromium crash or a wedged driver costs a
restart of this process, never the worker, and Playwright is never imported by the worker.

Pool policy, all inside this process:
- at most `contexts` browser contexts, each rendering one page at a time; a render waits at
  most `queue_wait` seconds for one (then "busy": the task is re-queued, not failed);
- a context serves renders with the same proxy, user agent, cookie set and blocked resource
  types; before each page its cookies are reset to the lent ones (what the site set during the
  previous page is dropped, as the fetch layer keeps nothing between requests);
- a context is closed after `context_pages` pages, or when its page failed to close;
- after a page, at most once a second, the browser's memory (PSS of its process tree,
  procmem.py) is compared with `memory_mb`: above it, new renders wait while the running ones
  finish, then the browser is restarted;
- a browser that disconnects (crashed, killed) fails its running renders as "crashed" and the
  next render launches a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from exceptions import InvalidSelector
from external_interface.browser import procmem, wire
from external_interface.browser.actions import Deadline, Runner, Stalled
from external_interface.browser.model import action_from_wire
from external_interface.browser.network import Network, Progress, timeout_reply
from external_interface.browser.pagefacts import (
    context_key,
    cookies_for,
    document_seconds,
    history,
    one_line,
    quietly,
    same_document,
)
from external_interface.browser.selector_check import check_in_page, selectors_of

log = logging.getLogger("chaincrawl.browser.driver")

# The switches this machine's Chromium needs: headless, no sandbox (containers, root), no GPU,
# and none of the background traffic to Google's hosts (QUIC probes, component updates, sync,
# first-run pings). Playwright adds most of these itself and a fresh --user-data-dir per launch.
BASE_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
CAPTURE_TIMEOUT = 2.0  # per screenshot and per DOM read of a failing page
CLOSE_TIMEOUT = 3.0  # closing a page or context
MEMORY_CHECK_EVERY = 1.0
NET_ERROR = re.compile(r"net::(ERR_[A-Z_0-9]+)")
# Playwright's words for a page, context or browser that died under a call
_GONE = re.compile(r"has been closed|[Cc]rash|Connection closed|Target closed|Browser closed")


class Failure(Exception):
    """A render that ends in an error reply: `kind` says which (pool.py maps it to our
    exceptions), `capture` what the page showed."""

    def __init__(self, kind: str, message: str, capture: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.capture = capture or {}


@dataclass
class Slot:
    """One browser context and what it may be reused for."""

    context: Any
    key: tuple[Any, ...]
    generation: int
    page: Any = None  # kept between renders: a new tab costs a renderer start (~200 ms)
    headers: bool = False  # the page carries a previous render's extra headers
    pages: int = 0
    bad: bool = False
    created: float = field(default_factory=time.monotonic)


def _playwright() -> Any:
    """Playwright's async API, imported here only: it is an optional package (the `browser`
    extra) and only this process ever loads it."""
    import playwright.async_api

    return playwright.async_api


class Driver:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.max_contexts = int(cfg["contexts"])
        self.context_pages = int(cfg["context_pages"])
        self.memory_mb = float(cfg["memory_mb"])
        self.queue_wait = float(cfg["queue_wait"])
        self.pw_mod: Any = None
        self.pw: Any = None
        self.browser: Any = None
        self.browser_pid: int | None = None
        self.generation = 0
        self.idle: list[Slot] = []
        self.open = 0  # contexts of the current browser, idle or busy (or being made)
        self.retiring = False
        self.cond: asyncio.Condition | None = None
        self.counters: Counter[str] = Counter()
        self.last_memory = 0.0
        self.last_memory_check = 0.0
        self.stop = asyncio.Event()

    # --- lifecycle ------------------------------------------------------------------------
    async def serve(self) -> None:
        self.cond = asyncio.Condition()
        self.pw_mod = _playwright()
        self.pw = await self.pw_mod.async_playwright().start()
        try:
            await self._launch()
        except Exception as exc:
            print(f"error: {one_line(exc)}", flush=True)
            await self.pw.stop()
            raise SystemExit(3) from None
        path = self.cfg["socket"]
        server = await asyncio.start_unix_server(self._handle, path=path, limit=1 << 20)
        os.chmod(path, 0o600)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        lifeline = asyncio.ensure_future(self._watch_stdin())
        print("ready", flush=True)
        await self.stop.wait()
        lifeline.cancel()
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._close_browser(), 10)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.pw.stop(), 10)

    async def _watch_stdin(self) -> None:
        """The worker holds our stdin open; EOF means it is gone (even if it was killed)."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while await reader.read(4096):
            pass
        self.stop.set()

    async def _launch(self) -> None:
        before = set(procmem.browser_pids(os.getpid()))
        browser = await self.pw.chromium.launch(
            executable_path=self.cfg["executable"],
            args=[*BASE_ARGS, *self.cfg.get("args", ())],
            headless=True,
            timeout=float(self.cfg.get("start_timeout", 30)) * 1000,
            handle_sigint=False,
            handle_sigterm=False,
            handle_sighup=False,
        )
        self.generation += 1
        self.browser = browser
        self.idle.clear()
        self.open = 0
        self.retiring = False
        browser.on("disconnected", lambda b: self._disconnected(b))
        new = [p for p in procmem.browser_pids(os.getpid()) if p not in before]
        self.browser_pid = max(new) if new else None
        self.counters["launches"] += 1
        log.info("browser %s started (pid %s)", browser.version, self.browser_pid)

    def _disconnected(self, browser: Any) -> None:
        if browser is self.browser:
            log.warning("browser (pid %s) disconnected", self.browser_pid)
            self.counters["crashes"] += 0 if self.stop.is_set() else 1
            self.browser = None

    def _alive(self) -> bool:
        return self.browser is not None and self.browser.is_connected()

    async def _close_browser(self) -> None:
        browser, self.browser = self.browser, None
        self.idle.clear()
        self.open = 0
        if browser is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(browser.close(), 10)
        pid, self.browser_pid = self.browser_pid, None
        if pid:  # a browser that did not go when asked
            procmem.kill([pid])

    # --- contexts -------------------------------------------------------------------------
    async def _borrow(self, req: dict[str, Any], deadline: float) -> Slot:
        assert self.cond is not None
        loop = asyncio.get_running_loop()
        key = context_key(req)
        give_up = min(deadline, loop.time() + self.queue_wait)
        evict: Slot | None = None
        async with self.cond:
            while True:
                if not self._alive() or (self.retiring and self.open == len(self.idle)):
                    await self._restart()
                if not self.retiring:
                    for i, slot in enumerate(self.idle):
                        if slot.key == key:
                            return self.idle.pop(i)
                    if self.open < self.max_contexts:
                        self.open += 1
                        break
                    if self.idle:  # the least recently used idle context makes room
                        evict = self.idle.pop(0)
                        self.counters["contexts_evicted"] += 1
                        break
                left = give_up - loop.time()
                if left <= 0:
                    busy = self.open - len(self.idle)
                    if deadline <= give_up:
                        raise Failure(
                            "timeout", f"no browser context free before the deadline ({busy} busy)"
                        )
                    raise Failure(
                        "busy",
                        f"all {self.max_contexts} browser contexts busy for {self.queue_wait:.1f} s",
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.cond.wait(), left)
        generation = self.generation
        if evict is not None:
            await quietly(evict.context.close(), CLOSE_TIMEOUT)
        try:
            context = await asyncio.wait_for(
                self._new_context(req), max(0.1, deadline - loop.time())
            )
        except BaseException:
            async with self.cond:
                if generation == self.generation:
                    self.open -= 1
                self.cond.notify_all()
            raise
        self.counters["contexts_created"] += 1
        return Slot(context=context, key=key, generation=generation)

    async def _new_context(self, req: dict[str, Any]) -> Any:
        # certificates are checked as the fetch layer checks them; service workers are blocked
        # (they would answer requests past the route that blocks images and fonts)
        options: dict[str, Any] = {"service_workers": "block"}
        if req.get("proxy"):
            options["proxy"] = req["proxy"]
        if req.get("user_agent"):
            options["user_agent"] = req["user_agent"]
        context = await self.browser.new_context(**options)
        block = frozenset(req.get("block") or ())
        if block:

            async def route(r: Any) -> None:
                if r.request.resource_type in block:
                    await r.abort("blockedbyclient")
                else:
                    await r.continue_()

            await context.route("**/*", route)
        return context

    async def _restart(self) -> None:
        """A new browser: the old one crashed, or it outgrew the memory ceiling and its last
        page finished (we hold the condition, so nothing borrows meanwhile)."""
        if self.browser is not None:
            self.counters["recycles"] += 1
            log.info("browser uses %.0f MB > %.0f MB: restarting", self.last_memory, self.memory_mb)
        await self._close_browser()
        await self._launch()

    async def _give_back(self, slot: Slot) -> None:
        assert self.cond is not None
        await self._check_memory()
        current = slot.generation == self.generation and self._alive()
        keep = current and not slot.bad and slot.pages < self.context_pages and not self.retiring
        if keep:  # popups the page opened (window.open, target=_blank) go with it
            for extra in [p for p in slot.context.pages if p is not slot.page]:
                await quietly(extra.close(run_before_unload=False), CLOSE_TIMEOUT)
        else:
            if slot.pages >= self.context_pages:
                self.counters["contexts_recycled"] += 1
            await quietly(slot.context.close(), CLOSE_TIMEOUT)
        async with self.cond:
            if slot.generation == self.generation:
                if keep:
                    self.idle.append(slot)
                else:
                    self.open -= 1
            self.cond.notify_all()

    async def _check_memory(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.browser_pid is None or (
            not force and now - self.last_memory_check < MEMORY_CHECK_EVERY
        ):
            return
        self.last_memory_check = now
        self.last_memory = await asyncio.to_thread(procmem.tree_memory_mb, self.browser_pid)
        if self.memory_mb and self.last_memory > self.memory_mb and self._alive():
            self.retiring = True

    # --- one connection = one request -----------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            req, _ = await wire.read(reader)
            header, blobs = await self._answer(req, reader)
            await wire.write(writer, header, blobs)
        except (wire.WireError, ConnectionError):
            pass  # the worker hung up (its own deadline, or it died): nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(
        self, req: dict[str, Any], reader: asyncio.StreamReader
    ) -> tuple[dict[str, Any], list[bytes]]:
        op = req.get("op")
        try:
            if op == "render":
                return await self._render_until_hangup(req, reader)
            if op == "stats":
                await self._check_memory(force=True)
                return {"ok": True, "stats": self.stats()}, []
            if op == "ping":
                return {"ok": True}, []
            return {"ok": False, "kind": "bad_request", "message": f"unknown op {op!r}"}, []
        except (wire.WireError, ConnectionError):
            raise
        except Exception as exc:  # a bug, or a browser that cannot start: answer and stay up
            log.exception("%s failed", op)
            kind = "error" if self._alive() else "crashed"
            return {"ok": False, "kind": kind, "message": one_line(exc)}, []

    async def _render_until_hangup(
        self, req: dict[str, Any], reader: asyncio.StreamReader
    ) -> tuple[dict[str, Any], list[bytes]]:
        """Render, but stop as soon as the worker hangs up: its greenlet or thread gave up, and
        the context is better spent on the next render."""
        render = asyncio.ensure_future(self._render(req))
        hangup = asyncio.ensure_future(reader.read(1))
        done, _ = await asyncio.wait({render, hangup}, return_when=asyncio.FIRST_COMPLETED)
        if render not in done:
            render.cancel()
            with contextlib.suppress(BaseException):
                await render
            raise ConnectionError("the worker hung up")
        hangup.cancel()
        return render.result()

    async def _render(self, req: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + float(req["timeout"])
        self.counters["renders"] += 1
        try:
            actions = [action_from_wire(a) for a in req.get("actions", ())]
            slot = await self._borrow(req, deadline)
        except Failure as f:
            self.counters[f"error_{f.kind}"] += 1
            return {"ok": False, "kind": f.kind, "message": str(f)}, []
        except (ValueError, TypeError) as exc:
            return {"ok": False, "kind": "bad_request", "message": str(exc)}, []
        except self.pw_mod.Error as exc:
            return self._failed(self._classify(exc), [])
        page, ok = None, False
        progress, net = Progress(), Network()
        try:
            if slot.page is None or slot.page.is_closed():
                slot.page = await slot.context.new_page()
            page = slot.page
            slot.pages += 1
            reply = await asyncio.wait_for(
                self._drive(page, slot, req, actions, deadline, progress, net),
                max(0.01, deadline - loop.time()) + 1.0,  # Playwright's own timeouts come first
            )
            ok = True
            return reply
        except InvalidSelector as exc:
            ok = True  # nothing was loaded: the page is as good as before
            return self._failed(Failure("bad_selector", str(exc)), [])
        except (Deadline, Stalled, TimeoutError, self.pw_mod.TimeoutError) as exc:
            detail = str(exc).splitlines()[0] if isinstance(exc, Deadline | Stalled) else ""
            kind, msg = timeout_reply(
                req["url"], loop.time() - started, float(req["timeout"]), progress, net, detail
            )
            capture = await self._capture(page) if self._alive() else {}
            return self._failed(Failure(kind, msg, capture), [])
        except self.pw_mod.Error as exc:
            failure = self._classify(exc)
            if failure.kind == "error" and page is not None and self._alive():
                failure.capture = await self._capture(page)
            return self._failed(failure, [])
        finally:
            if not ok and page is not None:  # a failed page is not reused: it may still be busy
                closed = await quietly(page.close(run_before_unload=False), CLOSE_TIMEOUT)
                slot.page = None
                slot.bad = slot.bad or not closed
            await self._give_back(slot)

    def _failed(self, failure: Failure, blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        self.counters[f"error_{failure.kind}"] += 1
        header: dict[str, Any] = {"ok": False, "kind": failure.kind, "message": str(failure)}
        cap = failure.capture
        if cap:
            header["capture"] = {"url": cap.get("url", "")}
            for name in ("screenshot", "dom"):
                if cap.get(name) is not None:
                    header["capture"][name] = len(blobs)
                    blobs.append(cap[name])
        return header, blobs

    def _classify(self, exc: BaseException) -> Failure:
        text = one_line(exc)
        if not self._alive() or _GONE.search(text):
            return Failure("crashed", f"the browser went away: {text}")
        m = NET_ERROR.search(text)
        if m:
            return Failure("net", m.group(1))
        return Failure("error", text)

    async def _capture(self, page: Any) -> dict[str, Any]:
        """What a failing page shows: its screenshot and DOM, each given up after a moment (a
        page busy in a script answers neither)."""
        if page is None:
            return {}
        out: dict[str, Any] = {"url": page.url}
        with contextlib.suppress(Exception):
            out["screenshot"] = await asyncio.wait_for(
                page.screenshot(type="png", timeout=CAPTURE_TIMEOUT * 1000, animations="disabled"),
                CAPTURE_TIMEOUT + 0.5,
            )
        with contextlib.suppress(Exception):
            out["dom"] = (await asyncio.wait_for(page.content(), CAPTURE_TIMEOUT)).encode()
        return out

    async def _drive(
        self,
        page: Any,
        slot: Slot,
        req: dict[str, Any],
        actions: list[Any],
        deadline: float,
        progress: Progress,
        net: Network,
    ) -> tuple[dict[str, Any], list[bytes]]:
        loop = asyncio.get_running_loop()
        started = loop.time()

        def remaining() -> float:
            return (deadline - loop.time()) * 1000

        def left() -> float:
            ms = remaining()
            if ms <= 0:
                raise Deadline("the render's deadline ran out")
            return ms

        progress.waiting("checking the selectors", False)
        await check_in_page(page, *selectors_of(req), self.pw_mod.Error)  # before loading
        await slot.context.clear_cookies()
        if req.get("cookies"):
            await slot.context.add_cookies(cookies_for(req["url"], req["cookies"]))
        if req.get("headers") or slot.headers:
            await page.set_extra_http_headers(req.get("headers") or {})
            slot.headers = bool(req.get("headers"))
        if same_document(page.url, req["url"]):  # else goto would only scroll to the fragment
            await page.goto("about:blank", timeout=left())
        answers: list[tuple[Any, asyncio.Future[bytes]]] = []
        pattern = re.compile(req["capture_json"]) if req.get("capture_json") else None

        def on_response(r: Any) -> None:
            if pattern is not None and pattern.search(r.url):
                answers.append((r, asyncio.ensure_future(r.body())))

        page.on("response", on_response)
        net.attach(page)
        try:
            until = req.get("wait_until", "load")
            progress.waiting(f"loading the page (until {until!r})", False)
            resp = await page.goto(req["url"], wait_until=until, timeout=left())
            steps = []
            if resp is None or resp.status < 400:
                # an error page would never show what the page is waited for: returned as is
                if req.get("wait_for"):
                    progress.waiting(f"waiting for wait_for {req['wait_for']!r} (visible)", True)
                    await page.wait_for_selector(req["wait_for"], timeout=left())
                runner = Runner(page, remaining, self.pw_mod.TimeoutError, net, progress)
                steps = [await runner.run(a) for a in actions]
            progress.waiting("reading the rendered DOM", False)
            dom = (await page.content()).encode()
        finally:
            page.remove_listener("response", on_response)
            net.detach(page)
        blobs = [dom]
        captured = []
        if answers:
            await asyncio.wait([f for _, f in answers], timeout=max(0.01, remaining() / 1000))
            for r, fut in answers:
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    captured.append(
                        {"url": r.url, "status": r.status, "headers": r.headers, "blob": len(blobs)}
                    )
                    blobs.append(fut.result())
                else:
                    fut.cancel()
        page_info = {"url": page.url, "status": 200, "headers": {}, "history": [], "blob": 0}
        if resp is not None:
            page_info.update(
                status=resp.status,
                headers=resp.headers,
                history=history(resp),
                elapsed=document_seconds(resp),
            )
        header = {
            "ok": True,
            "page": page_info,
            "captured": captured,
            "steps": steps,
            "elapsed": loop.time() - started,
        }
        return header, blobs

    # --- stats ----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "browser_pid": self.browser_pid,
            "browser_version": self.browser.version if self._alive() else None,
            "generation": self.generation,
            "contexts_max": self.max_contexts,
            "contexts_open": self.open,
            "contexts_idle": len(self.idle),
            "context_pages": self.context_pages,
            "memory_mb": round(self.last_memory, 1),
            "memory_ceiling_mb": self.memory_mb,
            "retiring": self.retiring,
            **self.counters,
        }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m external_interface.browser.driver CONFIG.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        cfg = json.load(f)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s driver %(levelname)s %(message)s"
    )
    asyncio.run(Driver(cfg).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
