"""A logging filter that masks secrets (credentials in URLs, cookies, passwords, tokens).

Installed on every handler of the worker's loggers, so even a careless `log.info(url)` in an
endpoint cannot leak a proxy password or a session cookie into a log file.
"""

from __future__ import annotations

import logging
import re

_PATTERNS = [
    (re.compile(r"(//)[^/@\s:]+:[^/@\s]+@"), r"\1***:***@"),
    (re.compile(r"(?i)\b(session|sessionid|cookie|token|password|passwd|pwd|secret|sign|authorization)"
                r"(\s*[=:]\s*)(['\"]?)[^\s'\";&,}]+"), r"\1\2\3***"),
]  # fmt: skip


_SECRET_KEYS = re.compile(
    r"(?i)(cookie|session|passw|pwd|token|secret|auth|sign|credential|proxy_url)"
)


def mask(value: object) -> object:
    """A copy of a JSON-like value with secret-looking keys' values replaced by '***'."""
    if isinstance(value, dict):
        return {k: "***" if _SECRET_KEYS.search(str(k)) else mask(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask(v) for v in value)
    if isinstance(value, str):
        return redact(value)
    return value


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
