from __future__ import annotations

import pytest

import exceptions as E
from exceptions import Policy, error_for_status, policy_for


@pytest.mark.parametrize(
    ("status", "cls", "policy"),
    [
        (404, E.NotFound, Policy.FAIL),
        (410, E.NotFound, Policy.FAIL),
        (400, E.ClientError, Policy.FAIL),
        (401, E.Forbidden, Policy.ROTATE),
        (403, E.Forbidden, Policy.ROTATE),
        (429, E.RateLimited, Policy.ROTATE),
        (500, E.ServerError, Policy.RETRY),
        (502, E.ServerError, Policy.RETRY),
        (503, E.ServerError, Policy.RETRY),
    ],
)
def test_status_maps_to_error_and_policy(status: int, cls: type, policy: Policy) -> None:
    err = error_for_status(status, "http://x/")
    assert type(err) is cls and err.status == status
    assert policy_for(err) is policy


@pytest.mark.parametrize(
    ("exc", "policy"),
    [
        (E.FetchTimeout("t"), Policy.RETRY),
        (E.ConnectError("c"), Policy.ROTATE),
        (E.ProxyError("p"), Policy.ROTATE),
        (E.TruncatedResponse("t"), Policy.RETRY),
        (E.ResponseTooLarge("big"), Policy.FAIL),
        (E.TooManyRedirects("loop"), Policy.FAIL),
        (E.LoginRequired("wall"), Policy.ROTATE),
        (E.CaptchaRequired("captcha"), Policy.ROTATE),
        (E.ResourceUnavailable("empty"), Policy.WAIT),
        (E.DeadlineExceeded("late"), Policy.RETRY),
        (E.ParseError("layout"), Policy.RETRY),
        (E.ItemValidationError("bad"), Policy.FAIL),
        (E.PoisonMessage("again"), Policy.FAIL),
        (E.ParamsError("p"), Policy.FAIL),
        (KeyError("bug in endpoint"), Policy.RETRY),
    ],
)
def test_every_error_has_a_policy(exc: BaseException, policy: Policy) -> None:
    assert policy_for(exc) is policy


def test_tree_in_docstring_names_every_error_class() -> None:
    doc = E.__doc__ or ""
    classes = [
        n for n, v in vars(E).items() if isinstance(v, type) and issubclass(v, E.ChainCrawlError)
    ]
    missing = [n for n in classes if n not in doc]
    assert not missing, f"error classes missing from the tree in exceptions.py: {missing}"


def test_an_http_error_names_its_url_without_secrets() -> None:
    from exceptions import NotFound, error_for_status

    err = error_for_status(404, "https://bob:hunter2@shop.example/item/7?page=2&token=abc&sig=x")
    assert isinstance(err, NotFound) and err.status == 404
    assert str(err) == "HTTP 404 for https://shop.example/item/7?page=2&token=***&sig=***"
    assert "hunter2" not in str(err) and "abc" not in str(err)
    assert err.url.startswith("https://bob:")  # the attribute keeps what the caller gave
    assert str(error_for_status(503, "http://h/x")) == "HTTP 503 for http://h/x"
    assert str(error_for_status(500)) == "HTTP 500"
    named = NotFound("no recorded answer for GET http://h/y", status=404, url="http://h/y")
    assert str(named) == "no recorded answer for GET http://h/y"  # not named twice
