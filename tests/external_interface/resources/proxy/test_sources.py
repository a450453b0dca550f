"""Harvesters: list page (parsel), file and provider API, then first validation end to end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.proxy_farm import TargetSite
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.proxy.sources import (
    ApiSource,
    FileSource,
    PageSource,
    ProxySource,
    harvest,
    source_from_spec,
)
from external_interface.resources.proxy.validate import ProxyValidator
from tests.external_interface.proxy_fixtures import ProxyFactory
from utils.registry import UnknownNameError


@pytest.fixture
def listing(target_site: TargetSite) -> Iterator[TargetSite]:
    saved = target_site.listing, target_site.api_listing
    try:
        yield target_site
    finally:
        target_site.listing, target_site.api_listing = saved


def test_page_source_walks_pages_until_empty(listing: TargetSite) -> None:
    listing.listing = [
        [("10.0.0.1", 8080, "http"), ("10.0.0.2", 3128, "HTTPS")],
        [("10.0.0.3", 1080, "socks5"), ("10.0.0.4", 80, "http")],
    ]
    src = PageSource(listing.url("/proxies?page={page}"))
    assert list(src.fetch()) == [
        "http://10.0.0.1:8080",
        "http://10.0.0.2:3128",
        "http://10.0.0.4:80",
    ]


def test_page_parser_skips_rows_marked_transparent() -> None:
    def row(ip: str, port: str, extra: str = "", cls: str = "proxy") -> str:
        cells = f'<td class="ip">{ip}</td><td class="port">{port}</td><td class="type">http</td>'
        return f'<tr class="{cls}">{cells}{extra}</tr>'

    html = "<table>{}</table>".format(
        row("1.1.1.1", "80")
        + row("2.2.2.2", "80", '<td class="anonymity">Transparent</td>')
        + row("3.3.3.3", "x")
        + row("4.4.4.4", "80", cls="other")
        + row("5.5.5.5", "80", cls="proxy transparent")
    )
    assert list(PageSource("http://unused/").parse(html)) == ["http://1.1.1.1:80"]


def test_file_source(tmp_path: Path) -> None:
    f = tmp_path / "proxies.txt"
    f.write_text("# paid pool\n10.0.0.1:8080\n\nhttp://u:p@10.0.0.2:3128  # with credentials\n")
    assert list(FileSource(f).fetch()) == ["10.0.0.1:8080", "http://u:p@10.0.0.2:3128"]
    assert FileSource(f).name == "file:proxies.txt"


def test_api_source(listing: TargetSite) -> None:
    listing.api_listing = [
        "10.0.0.1:8080",
        {"ip": "10.0.0.2", "port": 3128, "type": "http"},
        {"host": "10.0.0.3", "port": "80", "username": "u", "password": "p@ss"},
        {"ip": "10.0.0.4", "port": 1080, "protocol": "socks5"},
        {"ip": "10.0.0.5"},
    ]
    src = ApiSource(listing.url("/api/proxies?key=SECRET"))
    assert "SECRET" not in src.name
    assert list(src.fetch()) == [
        "10.0.0.1:8080",
        "http://10.0.0.2:3128",
        "http://u:p%40ss@10.0.0.3:80",
    ]
    assert list(ApiSource.parse(["a:1"])) == ["a:1"]
    assert list(ApiSource.parse({"proxies": ["b:2"]})) == ["b:2"]


def test_source_specs(tmp_path: Path) -> None:
    assert isinstance(source_from_spec("page:http://x/p?page={page}"), PageSource)
    assert isinstance(source_from_spec(f"file:{tmp_path}/p.txt"), FileSource)
    assert isinstance(source_from_spec("api:http://x/api"), ApiSource)
    with pytest.raises(UnknownNameError, match="did you mean 'page'"):
        source_from_spec("pgae:http://x")
    with pytest.raises(ValueError):
        source_from_spec("file")


def test_harvest_then_first_validation(
    pool: GlobalPool, proxies: ProxyFactory, listing: TargetSite, tmp_path: Path
) -> None:
    good = proxies.healthy(2)
    leaky = proxies.transparent()
    dead = proxies.dead()
    listing.listing = [
        [(p.host, p.port, "http") for p in (good[0], leaky)],
        [(dead.host, dead.port, "http")],
    ]
    f = tmp_path / "list.txt"
    f.write_text(f"{good[1].id}\n{good[0].id}\n")
    srcs: list[ProxySource] = [
        PageSource(listing.url("/proxies?page={page}")),
        FileSource(f),
        FileSource(tmp_path / "missing.txt"),  # a broken source is skipped, not fatal
    ]

    counts = harvest(pool, srcs)

    assert counts == {"found": 5, "queued": 4, "failed_sources": 1}
    assert pool.raw_count() == 4
    ProxyValidator(pool).validate_new()
    assert sorted(pool.ids()) == sorted(p.id for p in good)
    assert harvest(pool, srcs[:2])["queued"] == 2  # members are not queued again; dropped ones are
