"""`LimitedFetcher` (CHAINCRAWL_FETCH_SLOTS) against a real local server that counts the
requests it has in flight: the cap holds, waiting counts against the request's deadline, and a
failed request gives its slot back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from exceptions import ConnectError, FetchTimeout
from external_interface.fetch import (
    FetcherSet,
    FetchRequest,
    LimitedFetcher,
    Urllib3Fetcher,
    default_fetcher,
)
from tests.external_interface.fetch.servers import serving
from utils.servers import free_port


class Counting(BaseHTTPRequestHandler):
    """Sleeps `?s=` seconds (default 0.1) per request, counting requests in flight."""

    lock = threading.Lock()
    now = 0
    peak = 0

    def do_GET(self) -> None:
        cls = type(self)
        with cls.lock:
            cls.now += 1
            cls.peak = max(cls.peak, cls.now)
        try:
            time.sleep(float(self.path.partition("s=")[2] or 0.1))
        finally:
            # Out of the count before the response goes out: once the client has read it, its
            # slot is free and its next request may arrive before this thread runs again
            # (counting until after the write saw 5 of 4 slots on a loaded machine).
            with cls.lock:
                cls.now -= 1
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def counting() -> Iterator[str]:
    Counting.now = Counting.peak = 0
    with serving(Counting) as url:
        yield url


def crawl(fetcher: Any, url: str, n: int = 24, threads: int = 12) -> list[int]:
    with ThreadPoolExecutor(threads) as ex:
        return list(ex.map(lambda _: fetcher.fetch(FetchRequest("GET", url)).status, range(n)))


def test_the_server_never_sees_more_than_the_fetch_slots(counting: str) -> None:
    assert crawl(Urllib3Fetcher(), f"{counting}/?s=0.1") == [200] * 24
    unlimited = Counting.peak
    Counting.peak = 0
    assert crawl(LimitedFetcher(Urllib3Fetcher(), 4), f"{counting}/?s=0.1") == [200] * 24
    assert unlimited > 4  # the server does see 12 threads' requests at once without the cap
    assert Counting.peak == 4


def hold_the_slot(f: LimitedFetcher, url: str) -> threading.Thread:
    """A request holding `f`'s one slot, started and seen by the server before this returns."""
    holder = threading.Thread(target=f.fetch, args=(FetchRequest("GET", url),))
    holder.start()
    deadline = time.monotonic() + 30
    while Counting.now < 1:
        assert time.monotonic() < deadline, "the holder's request never reached the server"
        time.sleep(0.01)
    return holder


def test_waiting_for_a_slot_counts_against_the_request_deadline(counting: str) -> None:
    f = LimitedFetcher(Urllib3Fetcher(), 1)
    holder = hold_the_slot(f, f"{counting}/?s=3")  # held far longer than the 0.3 s deadline
    with pytest.raises(FetchTimeout, match=r"no fetch slot free within 0\.3 s"):
        f.fetch(FetchRequest("GET", f"{counting}/?s=0", timeout=0.3))
    holder.join()
    # a request that waited gets only what is left of its deadline for the request itself:
    # ~4 s waiting + a 2 s answer > its 3 s deadline (with the whole 3 s it would succeed)
    holder = hold_the_slot(f, f"{counting}/?s=4")
    with pytest.raises(FetchTimeout):
        f.fetch(FetchRequest("GET", f"{counting}/?s=2", timeout=3.0))
    holder.join()


def test_a_failed_request_gives_its_slot_back(counting: str) -> None:
    f = LimitedFetcher(Urllib3Fetcher(), 1)
    for _ in range(3):
        with pytest.raises(ConnectError):
            f.fetch(FetchRequest("GET", f"http://127.0.0.1:{free_port()}/", timeout=1.0))
    assert f.fetch(FetchRequest("GET", f"{counting}/?s=0", timeout=1.0)).status == 200


def test_fetch_slots_setting_and_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from config import Settings

    monkeypatch.setenv("CHAINCRAWL_FETCH_SLOTS", "16")
    assert Settings().fetch_slots == 16
    monkeypatch.setenv("CHAINCRAWL_FETCH_SLOTS", "-1")
    with pytest.raises(ValueError, match="CHAINCRAWL_FETCH_SLOTS"):
        Settings()
    assert isinstance(default_fetcher(slots=16), LimitedFetcher)
    assert isinstance(default_fetcher(slots=0), FetcherSet)
    with pytest.raises(ValueError, match="at least 1"):
        LimitedFetcher(Urllib3Fetcher(), 0)


GEVENT_CRAWL = """
from gevent import monkey; monkey.patch_all()
import sys, time, gevent, gevent.lock
from exceptions import FetchTimeout
from external_interface.fetch import FetchRequest, LimitedFetcher, Urllib3Fetcher
url = sys.argv[1]
f = LimitedFetcher(Urllib3Fetcher(), 4)
jobs = [gevent.spawn(f.fetch, FetchRequest("GET", url + "/?s=0.1")) for _ in range(24)]
gevent.joinall(jobs, raise_error=True)
assert [j.value.status for j in jobs] == [200] * 24
from utils.process import RankedSlots
assert isinstance(f._semaphore(), RankedSlots), type(f._semaphore())
one = LimitedFetcher(Urllib3Fetcher(), 1)
holder = gevent.spawn(one.fetch, FetchRequest("GET", url + "/?s=3"))  # far past 0.3 s
gevent.sleep(0.2)
try:
    one.fetch(FetchRequest("GET", url + "/?s=0", timeout=0.3))
except FetchTimeout as exc:
    assert "no fetch slot free within 0.3 s" in str(exc), exc
else:
    raise AssertionError("no FetchTimeout")
holder.get()
# a freed slot goes to the most urgent waiting request (the run's priority), then in order
one = LimitedFetcher(Urllib3Fetcher(), 1)
done = []
def get(rank, name):
    one.fetch(FetchRequest("GET", url + "/?s=0.05", rank=rank))
    done.append(name)
holder = gevent.spawn(one.fetch, FetchRequest("GET", url + "/?s=0.3"))
gevent.sleep(0.1)
jobs = [gevent.spawn(get, r, n) for r, n in [(1, "low1"), (1, "low2"), (9, "urgent"), (1, "low3")]]
gevent.joinall([holder, *jobs], raise_error=True)
assert done == ["urgent", "low1", "low2", "low3"], done
import greenlet
from gevent.hub import Hub
sem, trips = LimitedFetcher(Urllib3Fetcher(), 4)._semaphore(), []
greenlet.settrace(lambda ev, args: trips.append(ev) if isinstance(args[1], Hub) else None)
for _ in range(1000):  # a free slot: taken and given back without a wait
    sem.acquire(timeout=5)
    sem.release()
greenlet.settrace(None)
assert not trips, len(trips)
print("ok")
"""


def test_gevent_workers_get_gevents_semaphore_and_the_same_cap(counting: str) -> None:
    """Under gevent the slots are ranked greenlet slots (the stdlib semaphore's Condition went
    through the hub on every acquire and release); the cap and the deadline hold the same, and
    a freed slot goes to the most urgent run's request first."""
    import subprocess
    import sys

    from config import ROOT

    out = subprocess.run([sys.executable, "-c", GEVENT_CRAWL, counting], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
    assert Counting.peak == 4
