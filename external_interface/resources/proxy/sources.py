"""Harvesters: where candidate proxies come from. Each source only lists addresses; the pool's
first validation decides what is kept, so a source can be noisy.

A source is anything with a `name` and a `fetch()` yielding proxy URLs. One implementation per
kind of source, chosen by a spec string `kind:argument` in `CHAINCRAWL_PROXY_SOURCES`:

    page:http://host/proxies?page={page}   an HTML list page, rows parsed with parsel
    file:/etc/chaincrawl/proxies.txt        one proxy per line, `#` comments
    api:https://vendor/api/list             a provider API answering JSON
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import requests
from parsel import Selector

from external_interface.resources.proxy.models import ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from utils.registry import Registry

log = logging.getLogger(__name__)

HTTP_TYPES = {"http", "https", ""}


class ProxySource(Protocol):
    name: str

    def fetch(self) -> Iterator[str]: ...


def _get(url: str, timeout: float) -> requests.Response:
    with requests.Session() as s:
        s.trust_env = False
        r = s.get(url, timeout=timeout, headers={"User-Agent": "chaincrawl-harvester/0.1"})
        r.raise_for_status()
        return r


class PageSource:
    """A paginated HTML list of `<tr class="proxy">` rows with ip, port and type cells.

    Rows typed other than http/https are skipped, and so are rows the list itself marks
    transparent (a `transparent` row class or an `anonymity` cell saying so).
    """

    def __init__(
        self,
        url: str,
        max_pages: int = 20,
        timeout: float = 15.0,
        row: str = "tr.proxy",
    ) -> None:
        self.url = url
        self.max_pages = max_pages if "{page}" in url else 1
        self.timeout = timeout
        self.row = row
        self.name = f"page:{url.split('?', 1)[0]}"

    def fetch(self) -> Iterator[str]:
        for page in range(1, self.max_pages + 1):
            try:
                html = _get(self.url.format(page=page), self.timeout).text
            except requests.HTTPError:
                return  # past the last page
            rows = list(self.parse(html))
            if not rows:
                return
            yield from rows

    def parse(self, html: str) -> Iterator[str]:
        for tr in Selector(text=html).css(self.row):
            ip = (tr.css("td.ip::text").get() or "").strip()
            port = (tr.css("td.port::text").get() or "").strip()
            kind = (tr.css("td.type::text").get() or "").strip().lower()
            anonymity = (tr.css("td.anonymity::text").get() or "").strip().lower()
            marked = (
                "transparent" in tr.attrib.get("class", "").split() or anonymity == "transparent"
            )
            if marked or kind not in HTTP_TYPES:
                continue
            if ip and port.isdigit():
                yield f"http://{ip}:{port}"


class FileSource:
    """A text file, one proxy per line (`host:port` or a URL with credentials)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"file:{self.path.name}"

    def fetch(self) -> Iterator[str]:
        for line in self.path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                yield line


class ApiSource:
    """A provider API answering JSON: a list, or a dict holding it under data/proxies/items.

    Entries are strings (`host:port`, URLs) or objects with ip|host, port and optional
    username|user, password|pass, type|protocol.
    """

    def __init__(self, url: str, timeout: float = 15.0) -> None:
        self.url = url
        self.timeout = timeout
        self.name = f"api:{url.split('?', 1)[0]}"  # the query may hold an API key

    def fetch(self) -> Iterator[str]:
        yield from self.parse(_get(self.url, self.timeout).json())

    @staticmethod
    def parse(payload: Any) -> Iterator[str]:
        if isinstance(payload, dict):
            payload = next((payload[k] for k in ("data", "proxies", "items") if k in payload), [])
        for entry in payload if isinstance(payload, list) else []:
            if isinstance(entry, str):
                yield entry
            elif isinstance(entry, dict):
                kind = str(entry.get("type") or entry.get("protocol") or "").lower()
                host = entry.get("ip") or entry.get("host")
                port = entry.get("port")
                if not host or not port or kind not in HTTP_TYPES:
                    continue
                user = entry.get("username") or entry.get("user")
                password = entry.get("password") or entry.get("pass")
                yield ProxyAddress(str(host), int(port), "http", user, password).url


# kind -> factory(argument) -> ProxySource
sources: Registry = Registry("proxy source")
sources.add("page", PageSource)
sources.add("file", FileSource)
sources.add("api", ApiSource)


def source_from_spec(spec: str) -> ProxySource:
    kind, sep, arg = spec.partition(":")
    if not sep or not arg:
        raise ValueError("a proxy source spec reads kind:argument, e.g. file:/path/list.txt")
    return sources.get(kind.strip())(arg.strip())


def harvest(pool: GlobalPool, srcs: list[ProxySource]) -> dict[str, int]:
    """Queue every source's proxies for their first validation. A failing source is skipped."""
    counts = {"found": 0, "queued": 0, "failed_sources": 0}
    for src in srcs:
        try:
            found = list(src.fetch())
        except Exception as exc:  # a dead source must not stop the others
            log.warning("proxy source %s failed: %s", src.name, type(exc).__name__)
            counts["failed_sources"] += 1
            continue
        queued = pool.add_raw(found)
        counts["found"] += len(found)
        counts["queued"] += queued
        log.info("proxy source %s: %d found, %d new", src.name, len(found), queued)
    return counts
