"""external_interface.fetch.curl_gevent: a transfer is started in the greenlet that adds it
(libcurl driven once at once, not at its 0 ms timer), and one that ends there is still woken
from the hub. A stand-in multi records what libcurl is asked; gevent's greenlets work without
monkey-patching, so this runs in the test process."""

from __future__ import annotations

from typing import Any

import pytest

gevent = pytest.importorskip("gevent")
pycurl = pytest.importorskip("pycurl")

from external_interface.fetch.curl_gevent import HubMulti  # noqa: E402


class FakeMulti:
    """What HubMulti asks of a CurlMulti; `finish` lists the handles the next socket_action
    ends (`code` 0: done, else failed)."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.finish: list[tuple[Any, int]] = []
        self.done: list[tuple[Any, int]] = []

    def add_handle(self, c: Any) -> None:
        self.calls.append(("add", c))

    def remove_handle(self, c: Any) -> None:
        self.calls.append(("remove", c))

    def socket_action(self, fd: int, action: int) -> tuple[int, int]:
        self.calls.append(("action", fd))
        self.done += self.finish
        self.finish = []
        return 0, len(self.done)

    def info_read(self) -> tuple[int, list[Any], list[Any]]:
        ok = [c for c, code in self.done if not code]
        failed = [(c, code, "refused") for c, code in self.done if code]
        self.done = []
        return 0, ok, failed


def _hub_multi() -> tuple[HubMulti, FakeMulti]:
    hm = HubMulti(gevent.get_hub())
    fake = FakeMulti()
    hm.multi = fake
    return hm, fake


def test_a_transfer_is_started_by_the_greenlet_that_adds_it() -> None:
    hm, fake = _hub_multi()
    g = gevent.spawn(hm.perform, "h1")
    gevent.sleep(0)  # the greenlet ran up to its wait
    assert fake.calls[:2] == [("add", "h1"), ("action", pycurl.SOCKET_TIMEOUT)]
    assert "h1" in hm.waiting
    fake.finish = [("h1", 0)]
    hm.loop.run_callback(hm._act, pycurl.SOCKET_TIMEOUT, 0)  # the hub's loop: socket ready
    g.join(timeout=5)
    assert g.successful() and ("remove", "h1") in fake.calls and not hm.waiting


def test_a_transfer_that_ends_at_once_is_woken_from_the_hub() -> None:
    hm, fake = _hub_multi()
    fake.finish = [("ok", 0)]
    assert gevent.spawn(hm.perform, "ok").get(timeout=5) is None
    fake.finish = [("bad", 7)]
    with pytest.raises(pycurl.error):
        gevent.spawn(hm.perform, "bad").get(timeout=5)
    assert not hm.waiting


def test_a_killed_greenlet_s_transfer_ending_at_once_is_dropped_once() -> None:
    hm, fake = _hub_multi()
    fake.finish = [("k", 0)]
    g = gevent.spawn(hm.perform, "k")
    gevent.sleep(0)  # added and ended in the kick; its wake-up is queued on the hub
    g.kill()
    gevent.sleep(0)
    assert fake.calls.count(("remove", "k")) == 1 and not hm.waiting
