"""sites.demo helpers: where the site is and how its refusals map to typed errors."""

from __future__ import annotations

import pytest

from exceptions import BannedError, Forbidden, LoginRequired, NotFound, ParseError
from external_interface.fetch import Response
from sites.demo import base_url, check_html, unwrap


def resp(body: bytes, status: int = 200, ctype: str = "application/json") -> Response:
    return Response(url="http://x/y", status=status, headers={"content-type": ctype},
                    content=body, elapsed=0.0)  # fmt: skip


def test_base_url_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEMO_BASE_URL", raising=False)
    assert base_url() == "http://127.0.0.1:8700"
    monkeypatch.setenv("DEMO_BASE_URL", "http://127.0.0.1:9999/")
    assert base_url() == "http://127.0.0.1:9999"


def test_envelopes() -> None:
    assert unwrap(resp(b'{"ok":1,"data":{"a":1}}')) == {"a": 1}
    assert unwrap(resp(b'{"code":0,"msg":"success","data":[]}')) == []
    with pytest.raises(ParseError):
        unwrap(resp(b'{"ok":0}'))


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b'{"error":"login_required","ok":0}', 401, LoginRequired),
        (b'{"error":"banned","retry_after":3.5,"code":403}', 403, BannedError),
        (b'{"error":"device_banned","code":403}', 403, BannedError),
        (b'{"error":"bad_user_agent","ok":0}', 403, Forbidden),
        (b'{"error":"unknown_device","code":403}', 403, Forbidden),
        (b'{"error":"not_found","ok":0}', 404, NotFound),
    ],
)
def test_api_refusals(body: bytes, status: int, error: type[Exception]) -> None:
    with pytest.raises(error) as ei:
        unwrap(resp(body, status))
    assert ei.type is error


def test_html_refusal_other_than_ban_is_forbidden() -> None:
    page = b'<body class="page-error error-bad_user_agent"><div class="error" data-error="bad_user_agent"></div></body>'
    with pytest.raises(Forbidden):
        check_html(resp(page, 403, "text/html"))
    check_html(resp(b"<body class='page-feed'></body>", 200, "text/html"))  # fine: no error
