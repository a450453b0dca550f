"""The fetch layer's cost per request: the project's fetcher against other HTTP clients.

    .venv/bin/python -m bench.fetch_clients [--requests 3000] [--repeat 3] [--gevent 16]
    .venv/bin/python -m bench.fetch_clients --callgrind --requests 200 --repeat 1

Why: a worker's CPU profile puts about a quarter of it in the HTTP fetch (urllib3's pool
handling, header parsing, the dropped-connection check before each reuse, send, body read).
This measures what a request costs the fetching process with each client, on the same pages
over keep-alive from the bench's replay server (`bench.replay_site`, its own process, so its
CPU is not counted): the shop's 8 KB and the heavy shop's 8-50 KB pages (`bench.pagesets`).

    project      the worker's stack on the urllib3 fetcher: `default_fetcher(kind="urllib3")`
                 (Urllib3Fetcher, the default before pycurl) with a worker's FetchRequest
                 (deadline, size limit, user agent), the body as `Response.text`
    curlfetcher  the same stack on the pycurl fetcher, the default (`default_fetcher()`,
                 CurlFetcher; under gevent its transfers go through the hub's CurlMulti)
    curlfetcher-tp  CurlFetcher with its gevent transfers in the hub's thread pool instead
                 (`gevent="threadpool"`, as ImpersonateFetcher): what the hand-off costs
    urllib3      a PoolManager tuned as the floor of that library: no retries, no redirects,
                 the body preloaded
    httpcore     a sync ConnectionPool
    pycurl       a reused Curl handle, WRITEFUNCTION into a list, HEADERFUNCTION
    impersonate  the project's ImpersonateFetcher (curl_cffi, Chrome's headers; HTTP/1.1 on
                 plain http); it always impersonates, so `curl_cffi` is also measured bare
    curl_cffi    a reused curl_cffi Curl handle, no impersonation, as pycurl

Every client decodes the body the same way: the charset of its Content-Type, through
`Response.text` (w3lib's resolution, the count of undecodable bytes). Each client sends
`--requests` requests per page set (the set's pages in order, cycled) after a warm-up that
opens its connections; the repeats interleave the clients (a different order each round).
CPU is `time.process_time()` of this process (every thread: libcurl under gevent runs in the
hub's thread pool), wall is `time.perf_counter()`, both per request in µs. `--gevent N` runs
the same requests from N greenlets (monkey-patching at the top of this module, before any
other import, only when the flag is given): a gevent worker's 16 slots. `--callgrind` reruns
the benchmark under valgrind and adds each run's user-space instructions per request, the same
for the same work whatever the machine's neighbours do (its CPU columns then measure
callgrind, not the client; the kernel's share, system calls, is not counted).
"""

from __future__ import annotations

import sys

GEVENT = any(a == "--gevent" or a.startswith("--gevent=") for a in sys.argv[1:])
if GEVENT and __name__ == "__main__":
    from gevent import monkey

    monkey.patch_all()

import argparse  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Protocol  # noqa: E402

import certifi  # noqa: E402
import urllib3  # noqa: E402

from bench.callgrind import VALGRIND, callgrind, totals  # noqa: E402
from bench.fetch_results import Result, Sample, table  # noqa: E402
from bench.pagesets import PAGESETS  # noqa: E402
from bench.replay_site import Page, ReplayServer  # noqa: E402
from config import Settings  # noqa: E402
from external_interface.fetch import (  # noqa: E402
    CurlFetcher,
    Fetcher,
    FetchRequest,
    ImpersonateFetcher,
    Response,
    default_fetcher,
    header_charset,
)
from external_interface.fetch.response import default_user_agent  # noqa: E402
from utils.process import gevent_patched  # noqa: E402

# optional: the bench extra (httpcore, pycurl); a client whose package is missing is skipped
try:
    import httpcore

    HAVE_HTTPCORE = True
except ImportError:
    HAVE_HTTPCORE = False
try:
    import pycurl

    HAVE_PYCURL = True
except ImportError:
    HAVE_PYCURL = False
try:
    from curl_cffi.const import CurlInfo, CurlOpt
    from curl_cffi.curl import Curl

    HAVE_CURL_CFFI = True
except ImportError:
    HAVE_CURL_CFFI = False
try:
    import gevent

    HAVE_GEVENT = True
except ImportError:
    HAVE_GEVENT = False

SETS = ("shop", "heavy")
UA = default_user_agent()
ACCEPT_ENCODING = "gzip, deflate"  # what Urllib3Fetcher sends: every client asks the same


def decode(body: bytes, content_type: str) -> str:
    """The body as text exactly as a worker's page gets it: `Response.text` with the charset
    of the Content-Type (what the project's fetcher returns)."""
    return Response("", 200, {}, body, 0.0, declared_encoding=header_charset(content_type)).text


def _blocking(fn: Callable[[], Any]) -> Any:
    """A call that blocks in C (libcurl): in the hub's thread pool under gevent, as
    ImpersonateFetcher runs its transfers, else here."""
    if HAVE_GEVENT and gevent_patched():
        return gevent.get_hub().threadpool.apply(fn)
    return fn()


class Client(Protocol):
    name: str

    def get(self, url: str) -> tuple[int, str]:
        """GET `url`: the body's size in bytes and its text."""
        ...

    def close(self) -> None: ...


class ProjectClient:
    """The worker's fetch stack, built and called as `lifecycle.runtime`/`context` do."""

    name = "project"
    kind = "urllib3"  # CHAINCRAWL_FETCHER

    def __init__(self, concurrency: int, slots: int = 0) -> None:
        s = Settings()
        self.settings = s
        self.fetcher = self._fetcher(s, slots)

    def _fetcher(self, s: Settings, slots: int) -> Fetcher:
        return default_fetcher(s.max_redirects, self.kind, slots, None, s.ca_bundle)

    def get(self, url: str) -> tuple[int, str]:
        s = self.settings
        req = FetchRequest(
            method="GET",
            url=url,
            headers={"User-Agent": UA},
            timeout=s.request_timeout,
            connect_timeout=s.connect_timeout,
            max_bytes=s.max_response_bytes,
        )
        resp = self.fetcher.fetch(req)
        return len(resp.content), resp.text

    def close(self) -> None:
        pass


class CurlFetcherClient(ProjectClient):
    """The worker's stack on the pycurl fetcher (`CHAINCRAWL_FETCHER=pycurl`)."""

    name = "curlfetcher"
    kind = "pycurl"


class CurlThreadpoolClient(ProjectClient):
    """CurlFetcher with a gevent worker's transfers in the hub's thread pool."""

    name = "curlfetcher-tp"

    def _fetcher(self, s: Settings, slots: int) -> Fetcher:
        return CurlFetcher(s.max_redirects, ca_bundle=s.ca_bundle, gevent="threadpool")


class Urllib3Client:
    """urllib3's floor: one PoolManager, no retries or redirects, the body preloaded."""

    name = "urllib3"

    def __init__(self, concurrency: int) -> None:
        self.pm = urllib3.PoolManager(
            num_pools=4, maxsize=max(1, concurrency), block=False, retries=False
        )
        self.headers = {"User-Agent": UA, "Accept-Encoding": ACCEPT_ENCODING, "Accept": "*/*"}

    def get(self, url: str) -> tuple[int, str]:
        r = self.pm.request("GET", url, headers=self.headers, retries=False, redirect=False)
        body = r.data
        return len(body), decode(body, r.headers.get("content-type", ""))

    def close(self) -> None:
        self.pm.clear()


class HttpcoreClient:
    """httpcore's sync ConnectionPool (what httpx sends through)."""

    name = "httpcore"

    def __init__(self, concurrency: int) -> None:
        self.pool = httpcore.ConnectionPool(max_connections=max(1, concurrency))
        self.headers = [
            (b"User-Agent", UA.encode()),
            (b"Accept-Encoding", ACCEPT_ENCODING.encode()),
            (b"Accept", b"*/*"),
        ]

    def get(self, url: str) -> tuple[int, str]:
        r = self.pool.request("GET", url, headers=self.headers)
        ctype = next((v for k, v in r.headers if k.lower() == b"content-type"), b"")
        body = r.content
        return len(body), decode(body, ctype.decode("latin-1"))

    def close(self) -> None:
        self.pool.close()


class _Handles:
    """Curl handles not in use, one per request in flight, reused with their connections."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make
        self.idle: list[Any] = []  # list.pop/append are atomic
        self.all: list[Any] = []

    def take(self) -> Any:
        if self.idle:
            return self.idle.pop()
        h = self.make()
        self.all.append(h)
        return h


class _Capture:
    """WRITEFUNCTION and HEADERFUNCTION of one transfer: the body's chunks, Content-Type."""

    __slots__ = ("chunks", "ctype")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.ctype = ""

    def write(self, chunk: bytes) -> int:
        self.chunks.append(chunk)
        return len(chunk)  # curl_cffi warns on None (pycurl takes either)

    def header(self, line: bytes) -> int:
        if line[:13].lower() == b"content-type:":
            self.ctype = line[13:].decode("latin-1").strip()
        return len(line)


class _CurlClient:
    """A reused Curl handle per request in flight: the loop pycurl's and curl_cffi's clients
    share; each sets up a handle (`_make`) and runs one transfer into a `_Capture`."""

    name = ""

    def __init__(self, concurrency: int) -> None:
        self.handles = _Handles(self._make)

    @staticmethod
    def _make() -> Any:
        raise NotImplementedError

    def _transfer(self, c: Any, url: str, cap: _Capture) -> None:
        raise NotImplementedError

    def get(self, url: str) -> tuple[int, str]:
        c = self.handles.take()
        cap = _Capture()
        try:
            self._transfer(c, url, cap)
        finally:
            self.handles.idle.append(c)
        body = b"".join(cap.chunks)
        return len(body), decode(body, cap.ctype)

    def close(self) -> None:
        for c in self.handles.all:
            c.close()


class PycurlClient(_CurlClient):
    """pycurl: a reused Curl handle per request in flight."""

    name = "pycurl"

    @staticmethod
    def _make() -> Any:
        c = pycurl.Curl()
        c.setopt(pycurl.NOSIGNAL, 1)
        c.setopt(pycurl.TIMEOUT_MS, 20_000)
        c.setopt(pycurl.CONNECTTIMEOUT_MS, 5_000)
        c.setopt(pycurl.USERAGENT, UA)
        c.setopt(pycurl.ACCEPT_ENCODING, ACCEPT_ENCODING)
        c.setopt(pycurl.HTTPHEADER, ["Accept: */*"])
        c.setopt(pycurl.CAINFO, certifi.where())
        return c

    def _transfer(self, c: Any, url: str, cap: _Capture) -> None:
        c.setopt(pycurl.URL, url)
        c.setopt(pycurl.WRITEFUNCTION, cap.chunks.append)
        c.setopt(pycurl.HEADERFUNCTION, cap.header)
        _blocking(c.perform)


class CurlCffiClient(_CurlClient):
    """curl_cffi's Curl handle without impersonation, reused as pycurl's."""

    name = "curl_cffi"

    @staticmethod
    def _make() -> Any:
        c = Curl(cacert=certifi.where())
        c.setopt(CurlOpt.NOSIGNAL, 1)
        c.setopt(CurlOpt.TIMEOUT_MS, 20_000)
        c.setopt(CurlOpt.CONNECTTIMEOUT_MS, 5_000)
        c.setopt(CurlOpt.USERAGENT, UA.encode())
        c.setopt(CurlOpt.ACCEPT_ENCODING, ACCEPT_ENCODING.encode())
        return c

    def _transfer(self, c: Any, url: str, cap: _Capture) -> None:
        c.setopt(CurlOpt.URL, url.encode())
        # perform() frees the header list it was given: a list for every transfer
        c.setopt(CurlOpt.HTTPHEADER, [b"Accept: */*"])
        c.setopt(CurlOpt.WRITEFUNCTION, cap.write)
        c.setopt(CurlOpt.HEADERFUNCTION, cap.header)
        _blocking(c.perform)
        if int(c.getinfo(CurlInfo.RESPONSE_CODE)) != 200:
            raise RuntimeError(f"{url}: HTTP {c.getinfo(CurlInfo.RESPONSE_CODE)!r}")


class ImpersonateClient:
    """The project's ImpersonateFetcher (Chrome's profile), called as a worker calls it."""

    name = "impersonate"

    def __init__(self, concurrency: int) -> None:
        s = Settings()
        self.settings = s
        self.fetcher = ImpersonateFetcher(s.max_redirects, ca_bundle=s.ca_bundle)

    def get(self, url: str) -> tuple[int, str]:
        s = self.settings
        req = FetchRequest(
            method="GET",
            url=url,
            timeout=s.request_timeout,
            connect_timeout=s.connect_timeout,
            max_bytes=s.max_response_bytes,
        )
        resp = self.fetcher.fetch(req)
        return len(resp.content), resp.text

    def close(self) -> None:
        pass


# name -> (class, whether the package it needs imported)
CLIENTS: dict[str, tuple[Callable[[int], Client], bool]] = {
    "project": (ProjectClient, True),
    "curlfetcher": (CurlFetcherClient, HAVE_PYCURL),
    "curlfetcher-tp": (CurlThreadpoolClient, HAVE_PYCURL),
    "urllib3": (Urllib3Client, True),
    "httpcore": (HttpcoreClient, HAVE_HTTPCORE),
    "pycurl": (PycurlClient, HAVE_PYCURL),
    "impersonate": (ImpersonateClient, HAVE_CURL_CFFI),
    "curl_cffi": (CurlCffiClient, HAVE_CURL_CFFI),
}


def available(names: list[str]) -> tuple[list[str], list[str]]:
    """(clients that can run, clients skipped because their package is not installed)."""
    ok = [n for n in names if CLIENTS[n][1]]
    return ok, [n for n in names if not CLIENTS[n][1]]


def site_pages(quick: bool = True, size: int | None = None) -> dict[str, dict[str, Page]]:
    """{set name: {target: page}}: the shop and the heavy shop (`size` pages each, else the
    sets' own size), each under its own prefix (`/shop...`, `/heavy/shop...`) so one replay
    server serves both."""
    out: dict[str, dict[str, Page]] = {}
    for name in SETS:
        pages = PAGESETS[name].build(quick=quick, pages=size).pages
        prefix = "" if name == "shop" else f"/{name}"
        out[name] = {prefix + t: p for t, p in pages.items()}
    return out


def _urls(base: str, targets: list[str], n: int) -> Iterator[str]:
    for i in range(n):
        yield base + targets[i % len(targets)]


def _instructions(label: str) -> int:
    """Under `--callgrind`: the instructions since the last zeroing, dumped as `label` (the
    newest `<out>.<n>` file), the counter zeroed again; else 0."""
    out = os.environ.get("BENCH_CALLGRIND_OUT")
    if not out:
        return 0
    callgrind("-d", label)
    dumps = Path(out).parent.glob(Path(out).name + ".*")
    newest = max(dumps, key=lambda p: int(p.suffix[1:]) if p.suffix[1:].isdigit() else -1)
    callgrind("-z")
    return totals(newest)


def run_once(client: Client, urls: list[str], concurrency: int, label: str = "") -> Sample:
    """`urls` fetched by `client` from `concurrency` greenlets (1: this thread), timed (and
    its instructions counted under `--callgrind`)."""
    counts = [0, 0, 0]  # pages, bytes, chars
    it = iter(urls)
    lock = threading.Lock()

    def loop() -> None:
        pages = size = chars = 0
        for url in it:  # a shared iterator: each URL once, whoever is free takes the next
            n, text = client.get(url)
            pages += 1
            size += n
            chars += len(text)
        with lock:
            counts[0] += pages
            counts[1] += size
            counts[2] += chars

    callgrind("-z")  # a no-op unless under --callgrind
    c0, w0 = time.process_time(), time.perf_counter()
    if concurrency > 1:
        gevent.joinall([gevent.spawn(loop) for _ in range(concurrency)], raise_error=True)
    else:
        loop()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    instructions = _instructions(label or client.name)
    return Sample(len(urls), counts[0], counts[1], counts[2], cpu, wall, instructions)


def measure(
    base: str,
    sets: dict[str, dict[str, Page]],
    names: list[str],
    requests: int,
    repeat: int,
    concurrency: int = 1,
    warmup: int = 50,
) -> list[Result]:
    """Every client on every page set, `repeat` rounds, the clients' order rotated per round;
    each client built once (its pool and handles stay warm between rounds)."""
    clients = {n: CLIENTS[n][0](concurrency) for n in names}
    results = {(n, s): Result(n, s) for s in sets for n in names}
    urls = {s: list(_urls(base, list(pages), requests)) for s, pages in sets.items()}
    try:
        for c in clients.values():  # connections opened before any timing
            run_once(c, list(_urls(base, list(sets[SETS[0]]), warmup)), concurrency)
        callgrind("-i", "on")  # under --callgrind: counted from here on
        for r in range(repeat):
            order = names[r % len(names) :] + names[: r % len(names)]
            for s in sets:
                for n in order:
                    sample = run_once(clients[n], urls[s], concurrency, f"{s}-{n}-{r}")
                    results[(n, s)].samples.append(sample)
    finally:
        for c in clients.values():
            c.close()
    return list(results.values())


def expected_bytes(pages: dict[str, Page], requests: int) -> int:
    """The bytes `requests` requests of the set's pages in order (cycled) must read."""
    bodies = [len(p.body) for p in pages.values()]
    return sum(bodies[i % len(bodies)] for i in range(requests))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000, help="per client and page set")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    ap.add_argument(
        "--gevent",
        type=int,
        default=0,
        metavar="N",
        help="send from N greenlets (the process monkey-patches itself at start)",
    )
    ap.add_argument(
        "--clients", default=",".join(CLIENTS), help=f"comma-separated, of {','.join(CLIENTS)}"
    )
    ap.add_argument("--full", action="store_true", help="the page sets at full size")
    ap.add_argument("--pages", type=int, default=None, help="pages per set (default: quick size)")
    ap.add_argument(
        "--callgrind",
        action="store_true",
        help="rerun under valgrind's callgrind and add user-space instructions per request "
        "(50-100x slower: pass --requests 300)",
    )
    a = ap.parse_args(argv)
    if a.callgrind and not os.environ.get("BENCH_CALLGRIND"):
        return _under_callgrind(sys.argv[1:] if argv is None else argv)
    if a.gevent > 1 and not gevent_patched():
        ap.error("--gevent needs its own process: python -m bench.fetch_clients --gevent N")
    wanted = [n.strip() for n in a.clients.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in CLIENTS]
    if unknown:
        ap.error(f"unknown clients {unknown}; known: {', '.join(CLIENTS)}")
    names, skipped = available(wanted)
    sets = site_pages(quick=not a.full, size=a.pages)
    pages = {t: p for s in sets.values() for t, p in s.items()}
    concurrency = max(1, a.gevent)
    with ReplayServer(pages) as site:
        mode = f"gevent, {concurrency} greenlets" if concurrency > 1 else "one thread"
        print(
            f"fetch clients: {a.requests} requests per client and page set, {a.repeat} "
            f"rounds, {mode}, keep-alive to {site.url} (server CPU not counted)"
        )
        results = measure(site.url, sets, names, a.requests, a.repeat, concurrency)
    for r in results:
        want = expected_bytes(sets[r.pageset], a.requests)
        for s in r.samples:
            if s.pages != a.requests or s.bytes != want:
                raise SystemExit(
                    f"{r.client} on {r.pageset}: {s.pages} pages, {s.bytes} bytes; "
                    f"expected {a.requests} pages, {want} bytes"
                )
    print(table(results, skipped))
    return 0


def _under_callgrind(argv: list[str]) -> int:
    """This benchmark again under callgrind, counting from the timed runs on (the replay
    server, a child process, runs uninstrumented)."""
    with tempfile.TemporaryDirectory(prefix="fetch-clients-cg-") as tmp:
        out = str(Path(tmp) / "callgrind.out")
        env = {**os.environ, "BENCH_CALLGRIND": "1", "BENCH_CALLGRIND_OUT": out}
        cmd = [
            *VALGRIND,
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "bench.fetch_clients",
        ]
        done = subprocess.run([*cmd, *argv], env=env, stderr=subprocess.DEVNULL, check=False)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
