"""pycurl transfers on a gevent hub without threads: one `CurlMulti` per hub, driven by the
hub's own loop (libcurl's socket and timer callbacks become io and timer watchers), as
tornado's curl_httpclient drives one from its IOLoop.

libcurl's easy `perform()` blocks, and the hub's thread pool that carries it costs a thread
hand-off per request (a wake-up, a GIL round trip, a waiter). Here a greenlet adds its easy
handle to the hub's multi and waits; the loop tells libcurl which socket is ready
(`socket_action`), libcurl reads, parses and decodes in C and calls the transfer's write and
header callbacks, and a finished transfer wakes its greenlet. Every handle of the hub shares
the multi's connection cache. Imported only on a gevent worker (curl.py asks for it there).
"""

from __future__ import annotations

import weakref
from typing import Any

import gevent
import pycurl
from gevent.hub import Waiter

_READ, _WRITE = 1, 2  # libev's (and gevent's) io events
_drivers: weakref.WeakKeyDictionary[Any, HubMulti] = weakref.WeakKeyDictionary()


def for_hub() -> HubMulti:
    """The driver of this thread's hub, made on first use."""
    hub = gevent.get_hub()
    d = _drivers.get(hub)
    if d is None:
        d = _drivers[hub] = HubMulti(hub)
    return d


class HubMulti:
    """A CurlMulti whose sockets and timeout the hub's loop watches; `perform(handle)` from
    a greenlet returns when that transfer ends (raises `pycurl.error` as the easy one does)."""

    def __init__(self, hub: Any) -> None:
        self.hub = hub
        self.loop = hub.loop
        self.multi = pycurl.CurlMulti()
        self.multi.setopt(pycurl.M_SOCKETFUNCTION, self._socket)
        self.multi.setopt(pycurl.M_TIMERFUNCTION, self._timer)
        self.watchers: dict[int, Any] = {}
        self.timer: Any = None
        self.waiting: dict[Any, Waiter] = {}

    def perform(self, c: Any) -> None:
        waiter = Waiter(self.hub)
        self.waiting[c] = waiter
        self.multi.add_handle(c)
        self._start()
        try:
            code, text = waiter.get()
        except BaseException:  # killed, or a gevent.Timeout: the transfer is dropped
            if self.waiting.pop(c, None) is not None:
                self.multi.remove_handle(c)
            raise
        if code:
            raise pycurl.error(code, text)

    def _start(self) -> None:
        """Let libcurl start the transfer just added (connect, or send on a kept connection)
        now, in the adding greenlet, rather than at its 0 ms timer: that fires only once the
        hub has run every greenlet ready before it, a page's parse or more (at 250 ms and 16
        in flight a request reached the server 1-2 ms after its slot was taken, 0.2-0.3 ms so).
        Transfers that end here are woken from the hub, as every other one."""
        m = self.multi
        try:
            while m.socket_action(pycurl.SOCKET_TIMEOUT, 0)[0] == pycurl.E_CALL_MULTI_PERFORM:
                pass
            while True:
                queued, ok, failed = m.info_read()
                for c in ok:
                    self.loop.run_callback(self._done_later, c, 0, "")
                for c, code, text in failed:
                    self.loop.run_callback(self._done_later, c, code, text)
                if not queued:
                    return
        except pycurl.error:  # the hub's next action on the multi reports it
            pass

    def _done_later(self, c: Any, code: int, text: str) -> None:
        if c in self.waiting:  # not dropped meanwhile (its greenlet killed)
            self._done(c, code, text)

    def _socket(self, what: int, fd: int, multi: Any, data: Any) -> None:
        """libcurl's socket callback: watch `fd` for what it waits for, or stop watching."""
        w = self.watchers.pop(fd, None)
        if w is not None:
            w.stop()
        if what == pycurl.POLL_REMOVE:
            return
        events = (_READ if what & pycurl.POLL_IN else 0) | (_WRITE if what & pycurl.POLL_OUT else 0)
        w = self.watchers[fd] = self.loop.io(fd, events)
        w.start(self._ready, fd, pass_events=True)

    def _timer(self, ms: int) -> None:
        """libcurl's timer callback: call it back in `ms` (-1: no timeout wanted)."""
        if self.timer is not None:
            self.timer.stop()
            self.timer = None
        if ms >= 0:
            self.timer = self.loop.timer(ms / 1000.0)
            self.timer.start(self._act, pycurl.SOCKET_TIMEOUT, 0)

    def _ready(self, events: int, fd: int) -> None:
        action = (pycurl.CSELECT_IN if events & _READ else 0) | (
            pycurl.CSELECT_OUT if events & _WRITE else 0
        )
        self._act(fd, action)

    def _act(self, fd: int, action: int) -> None:
        """Let libcurl move on `fd` (or its timeouts), then wake the finished transfers'
        greenlets (from the hub, as a socket's readiness wakes a greenlet)."""
        m = self.multi
        try:
            while m.socket_action(fd, action)[0] == pycurl.E_CALL_MULTI_PERFORM:
                pass
        except pycurl.error:  # a socket libcurl already let go of: the finished still count
            pass
        while True:
            queued, ok, failed = m.info_read()
            for c in ok:
                self._done(c, 0, "")
            for c, code, text in failed:
                self._done(c, code, text)
            if not queued:
                return

    def _done(self, c: Any, code: int, text: str) -> None:
        self.multi.remove_handle(c)
        waiter = self.waiting.pop(c, None)
        if waiter is not None:
            waiter.switch((code, text))
