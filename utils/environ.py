"""Point this process at other settings for a while (tests, benchmarks, scripts that drive a
crawl in-process), and put the environment back exactly as it was afterwards."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


def apply(env: Mapping[str, str]) -> dict[str, str | None]:
    """Set `env` in os.environ; returns what `restore` needs (None: the variable was unset)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    return saved


def restore(saved: Mapping[str, str | None]) -> None:
    """Undo `apply`: a variable that was unset is removed again, not left empty."""
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def patched(env: Mapping[str, str]) -> Iterator[None]:
    saved = apply(env)
    try:
        yield
    finally:
        restore(saved)
