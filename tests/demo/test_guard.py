"""The guarded front: browsers pass, scripts and contradictions are refused; the mix front."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from curl_cffi import requests as curl_requests

from demo.testing import DemoServer
from exceptions import ConnectError
from external_interface.fetch import FetchRequest, ImpersonateFetcher, Urllib3Fetcher
from external_interface.resources.user_agent import GENERIC

FIREFOX = GENERIC["pc"][2]


@pytest.fixture(scope="module")
def guarded() -> Iterator[DemoServer]:
    with DemoServer(size="tiny", guard=True) as server:
        yield server


def reason(resp: object) -> str:
    return resp.json()["reason"]  # type: ignore[attr-defined]


def test_scripts_are_refused_whatever_user_agent_they_send(guarded: DemoServer) -> None:
    ca = str(guarded.guard_ca)
    r = Urllib3Fetcher(ca_bundle=ca).fetch(
        FetchRequest("GET", guarded.guard_url + "/pc/feed", headers={"User-Agent": FIREFOX})
    )
    assert r.status == 403 and r.json() == {"error": "fingerprint", "reason": "HTTP/2 required"}
    r2 = requests.get(guarded.guard_url + "/pc/feed", verify=ca, timeout=10)
    assert r2.status_code == 403 and reason(r2) == "HTTP/2 required"


@pytest.mark.parametrize(
    "profile",
    ["chrome/desktop", "chrome/mobile", "edge/desktop", "firefox/desktop", "firefox/mobile",
     "safari/desktop", "safari/mobile"],
)  # fmt: skip
def test_every_profile_passes_as_its_browser(guarded: DemoServer, profile: str) -> None:
    f = ImpersonateFetcher(ca_bundle=str(guarded.guard_ca))
    r = f.fetch(FetchRequest("GET", guarded.guard_url + "/pc/feed", profile=profile))
    assert r.status == 200 and r.css("div.feed-item")


def test_a_handshake_that_contradicts_the_user_agent_is_refused_and_ours_follows_it(
    guarded: DemoServer,
) -> None:
    ca = str(guarded.guard_ca)
    # Chrome's handshake under a Firefox user agent (curl_cffi's target, the agent swapped in)
    r = curl_requests.get(guarded.guard_url + "/pc/feed", impersonate="chrome131",
                          headers={"User-Agent": FIREFOX}, verify=ca)  # type: ignore[arg-type]  # fmt: skip
    assert r.status_code == 403 and reason(r) == "the TLS handshake is not Firefox's"
    # curl_cffi's own Android target says sec-ch-ua-mobile: ?0 under a Mobile user agent
    r = curl_requests.get(guarded.guard_url + "/pc/feed", impersonate="chrome131_android",
                          verify=ca)  # type: ignore[arg-type]  # fmt: skip
    assert r.status_code == 403 and reason(r) == "sec-ch-ua-mobile contradicts the user agent"
    # the impersonating fetcher, asked for Chrome but lent a Firefox agent, sends as Firefox
    f = ImpersonateFetcher(ca_bundle=ca)
    ours = f.fetch(FetchRequest("GET", guarded.guard_url + "/pc/feed", profile="chrome/desktop",
                                headers={"User-Agent": FIREFOX}))  # fmt: skip
    assert ours.status == 200


def test_the_mix_front_switches_a_page_type_to_script_while_it_runs(
    tiny_server: DemoServer,
) -> None:
    f = Urllib3Fetcher()
    feed = f.fetch(FetchRequest("GET", tiny_server.url + "/mix/feed?page=1"))
    pid = feed.css("div.feed-item::attr(data-pid)").get()
    assert pid and feed.css(".pager .total-pages")
    post = f.fetch(FetchRequest("GET", f"{tiny_server.url}/mix/post/{pid}"))
    assert post.css("script").re(r"__DATA__") and not post.css("article::attr(data-pid)")
    try:
        assert tiny_server.set_mix(["feed"]) == ["feed"]
        shell = f.fetch(FetchRequest("GET", tiny_server.url + "/mix/feed?page=1"))
        assert not shell.css("div.feed-item") and shell.css("section#feed[data-state=loading]")
        static = f.fetch(FetchRequest("GET", f"{tiny_server.url}/mix/post/{pid}"))
        assert static.css("article.post-detail::attr(data-pid)").get() == pid
    finally:
        tiny_server.set_mix(["post"])


def test_certificates_are_checked_by_every_fetcher_and_a_ca_bundle_is_trusted(
    guarded: DemoServer,
) -> None:
    url = guarded.guard_url + "/pc/feed"
    for f in (ImpersonateFetcher(), Urllib3Fetcher()):  # certifi's CAs: the demo's is not one
        with pytest.raises(ConnectError):
            f.fetch(FetchRequest("GET", url))
    assert (
        ImpersonateFetcher(ca_bundle=str(guarded.guard_ca)).fetch(FetchRequest("GET", url)).status
        == 200
    )
