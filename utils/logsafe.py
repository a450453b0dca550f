"""A logging filter that masks secrets (credentials in URLs, cookies, passwords, tokens).

Installed on every handler of the worker's loggers, so even a careless `log.info(url)` in an
endpoint cannot leak a proxy password or a session cookie into a log file.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

_PATTERNS = [
    # an `Authorization` value's credentials, before the header rule masks only the scheme
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1\2***"),
    (re.compile(r"(//)[^/@\s:]+:[^/@\s]+@"), r"\1***:***@"),
    # `name=value` or a header's `Name: value`; a colon with no space after it is a Redis key
    # or a pool's `kind:site` name ("pool cookie:shop is empty"), which stays readable
    (re.compile(r"(?i)\b(session|sessionid|cookie|token|password|passwd|pwd|secret|sign|authorization)"
                r"(\s*=\s*|\s*:\s+)(['\"]?)[^\s'\";&,}]+"), r"\1\2\3***"),
]  # fmt: skip


SECRET_KEY_PARTS = (
    "cookie",
    "passw",
    "pwd",
    "token",
    "secret",
    "proxy",
    "proxies",
    "authorization",
    "session",
    "apikey",
    "api_key",
    "credential",
    "signature",
)
SECRET_KEY_NAMES = {"sign", "auth", "sid", "pass"}  # too short to match inside other names
MASK = "***"


def is_secret_key(key: object) -> bool:
    k = str(key).lower().replace("-", "_")
    return any(p in k for p in SECRET_KEY_PARTS) or bool(SECRET_KEY_NAMES & set(k.split("_")))


def mask(value: Any, _depth: int = 0) -> Any:
    """A copy with values under secret-looking keys replaced and URL credentials redacted."""
    if _depth > 8:
        return "..."
    if isinstance(value, Mapping):
        return {
            k: (MASK if is_secret_key(k) and v not in (None, "") else mask(v, _depth + 1))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(mask(v, _depth + 1) for v in value)
    if isinstance(value, str):
        return redact(value)
    return value


def task_argsrepr(params: object, meta: object = None, maxsize: int = 1024) -> str:
    """What Celery shows of an endpoint message `(params, meta)` (Flower, events, inspect):
    readable, with secrets masked, capped in size."""
    from celery.utils.saferepr import saferepr

    return redact(saferepr((mask(params), mask(meta)), maxsize))


def redact(text: str) -> str:
    for pat, repl in _PATTERNS:
        text = pat.sub(repl, text)
    return text


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = redact(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        return True


def install(logger: logging.Logger | None = None) -> None:
    target = logger or logging.getLogger()
    for h in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in h.filters):
            h.addFilter(RedactingFilter())


_URL_CREDENTIALS = re.compile(r"//[^/@\s]+@")


def safe_url(url: str) -> str:
    """A URL to show: without its user and password."""
    return _URL_CREDENTIALS.sub("//", url)


def safe_text(exc: BaseException) -> str:
    """Error text for logs and dead letters; URLs lose their credentials."""
    return _URL_CREDENTIALS.sub("//***@", str(exc))[:500]
