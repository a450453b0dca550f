"""Query-parameter parsing with the platform's error answers (400 bad_request, 404 not_found)."""

from __future__ import annotations

from typing import TypeVar

from aiohttp import web

from demo.responses import error_response


class Reject(Exception):
    """Abort a handler with a ready response (turned into that response by `guards._call`)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


def bad_request(request: web.Request, message: str) -> Reject:
    return Reject(error_response(request, 400, "bad_request", message))


def not_found(request: web.Request, what: str) -> Reject:
    return Reject(error_response(request, 404, "not_found", f"no such {what}"))


T = TypeVar("T")


def found(request: web.Request, value: T | None, what: str) -> T:
    """`value`, or a 404 naming `what` when the platform has no such thing."""
    if value is None:
        raise not_found(request, what)
    return value


def int_param(request: web.Request, name: str, default: int, minimum: int = 1) -> int:
    raw = request.query.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(request, f"{name} must be an integer") from None
    if value < minimum:
        raise bad_request(request, f"{name} must be >= {minimum}")
    return value


def required(request: web.Request, name: str) -> str:
    value = request.query.get(name, "")
    if not value:
        raise bad_request(request, f"missing parameter {name}")
    return value
