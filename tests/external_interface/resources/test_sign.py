"""The demo signer: the README's test vector, the reference implementation on awkward
parameters, and signatures the demo server accepts (or rejects with the wrong key)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from demo import signing
from demo.testing import DemoServer
from exceptions import ConfigError
from external_interface.resources.base import OutgoingRequest
from external_interface.resources.sign import (
    HmacQuerySigner,
    SignProvider,
    query_pairs,
    sign_key,
    signers,
)

KEY = "demo-sign-key"


def demo_signer() -> HmacQuerySigner:
    import sites.demo.production  # noqa: F401 - registers the demo's signer

    return signers.get("demo")("demo")  # type: ignore[return-value]


def test_readme_test_vector() -> None:
    s = HmacQuerySigner(KEY)
    pairs = [("user_id", "u1"), ("page", "2"), ("ts", "1700000000")]
    assert s.signature(pairs) == signing.sign(dict(pairs), KEY)
    assert len(s.signature(pairs)) == 32


def test_signs_url_query_and_params_like_the_server_decodes_them() -> None:
    req = OutgoingRequest(
        "GET",
        "http://x/app/api/search?q=%E6%96%B0%E9%97%BB&empty=",
        params={"page": 2, "tags": ["b", "a"], "skip": None, "sign": "stale"},
    )
    HmacQuerySigner(KEY).sign(req, now=1700000000)
    assert req.params["ts"] == "1700000000"
    pairs = [("q", "新闻"), ("empty", ""), ("page", "2"), ("tags", "b"), ("tags", "a"),
             ("ts", "1700000000")]  # fmt: skip
    assert req.params["sign"] == signing.sign(pairs, KEY)
    assert query_pairs(req.url, {"x": 1})[-1] == ("x", "1")


def test_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAINCRAWL_SIGN_KEY_SHOP", "k1")
    assert sign_key("shop") == "k1"
    monkeypatch.delenv("CHAINCRAWL_SIGN_KEY_SHOP")
    with pytest.raises(ConfigError):
        sign_key("shop")
    assert sign_key("shop", "fallback") == "fallback"


def test_a_site_without_signer_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        SignProvider("nosuchsite").prepare(OutgoingRequest("GET", "http://x/"), None)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoServer]:
    with DemoServer(size="tiny", features=["sign"], sign_key="a-custom-key") as server:
        yield server


def send(req: OutgoingRequest) -> requests.Response:
    ua = {"User-Agent": "DemoApp/3.2.1 (Android 14; Pixel 8)"}
    return requests.get(req.url, params=req.params, headers=ua, timeout=5)


def test_demo_server_accepts_our_signatures(
    demo: DemoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAINCRAWL_SIGN_KEY_DEMO", "a-custom-key")
    prov = SignProvider("demo", "app", demo_signer())
    cases: list[tuple[str, dict[str, Any]]] = [
        ("/app/api/feed", {"page": 1, "size": 3}),
        ("/app/api/user_info?user_id=u2", {}),
        ("/app/api/user_statuses", {"user_id": "u3", "page": "1"}),
        ("/app/api/comments", {"post_id": "p1", "size": 50}),
    ]
    for path, params in cases:
        req = OutgoingRequest("GET", demo.url + path, params=dict(params))
        prov.prepare(req, None)  # type: ignore[arg-type]
        r = send(req)
        assert r.status_code == 200, (path, r.text)
    assert demo.stats().get("rejections", {}).get("bad_sign", 0) == 0


def test_wrong_key_or_stale_ts_is_rejected(demo: DemoServer) -> None:
    req = OutgoingRequest("GET", demo.url + "/app/api/feed", params={"page": 1})
    HmacQuerySigner("not-the-key").sign(req)
    assert send(req).json()["error"] == "bad_sign"
    req = OutgoingRequest("GET", demo.url + "/app/api/feed", params={"page": 1})
    HmacQuerySigner("a-custom-key").sign(req, now=time.time() - 3600)
    assert "skew" in send(req).json()["detail"]
