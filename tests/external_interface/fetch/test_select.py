"""Which fetcher sends a request: by name, per endpoint, per site; one set per process."""

from __future__ import annotations

import pytest

from exceptions import ConfigError
from external_interface.fetch import (
    FetcherSet,
    FetchRequest,
    ImpersonateFetcher,
    Urllib3Fetcher,
    choose,
    select,
)
from external_interface.fetch.select import Choice, parse_spec
from tests.testsite.server import TestSite
from utils.registry import UnknownNameError


def test_a_spec_names_a_fetcher_and_for_impersonation_a_profile_of_the_platform(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the spec's reading, whether or not pycurl can be imported here
    monkeypatch.setattr(select, "installed", lambda: True)
    assert parse_spec("impersonate", "pc") == Choice("impersonate", "chrome/desktop")
    assert parse_spec("impersonate:safari", "h5") == Choice("impersonate", "safari/mobile")
    assert parse_spec("impersonate:firefox/desktop", "h5") == Choice(
        "impersonate", "firefox/desktop"
    )
    assert parse_spec("requests") == Choice("requests")
    assert parse_spec("pycurl", "h5") == Choice("pycurl")
    with pytest.raises(UnknownNameError, match="did you mean 'impersonate'"):
        parse_spec("impersonat")
    with pytest.raises(ValueError, match="takes no browser profile"):
        parse_spec("urllib3:chrome")
    with pytest.raises(ValueError, match="takes no browser profile"):
        parse_spec("pycurl:chrome")
    monkeypatch.setattr(select, "installed", lambda: False)
    with pytest.raises(
        ValueError, match=r"needs pycurl, which cannot be imported.*CHAINCRAWL_FETCHER=urllib3"
    ):
        parse_spec("pycurl", "h5")


def test_the_site_variable_wins_over_the_endpoint_s_declaration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert choose("", "shop", "pc") == Choice()  # the process's
    assert choose("impersonate", "shop", "h5") == Choice("impersonate", "chrome/mobile")
    monkeypatch.setenv("CHAINCRAWL_FETCHER_SHOP", "urllib3")
    assert choose("impersonate", "shop", "h5") == Choice("urllib3")
    monkeypatch.setenv("CHAINCRAWL_FETCHER_SHOP", "impersonate:firefox")
    assert choose("", "shop", "app") == Choice("impersonate", "firefox/app")
    monkeypatch.setenv("CHAINCRAWL_FETCHER_SHOP", "impersonate:opera")  # a page fails, no retry
    with pytest.raises(ConfigError, match="CHAINCRAWL_FETCHER_SHOP: unknown browser profile"):
        choose("", "shop", "pc")


def test_the_set_builds_each_fetcher_once_and_routes_by_name() -> None:
    site = TestSite().start()
    try:
        fs = FetcherSet("urllib3")
        assert isinstance(fs.get(), Urllib3Fetcher) and fs.get("") is fs.get("urllib3")
        r = fs.fetch(FetchRequest("GET", f"{site.url}/detail/x", fetcher="impersonate",
                                  profile="firefox/desktop"))  # fmt: skip
        assert r.status == 200
        imp = fs.get("impersonate")
        assert isinstance(imp, ImpersonateFetcher) and imp.connections == 1
        fs.fetch(FetchRequest("GET", f"{site.url}/detail/x"))  # the default: not the impersonator
        assert imp.connections == 1
    finally:
        site.stop()
    with pytest.raises(ConfigError, match="CHAINCRAWL_FETCHER: unknown fetcher 'curl'"):
        FetcherSet("curl")
