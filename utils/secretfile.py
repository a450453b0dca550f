"""Secrets generated on first use and kept in files only their owner can read (mode 0600).

Several processes may ask for the same secret at once (workers starting side by side, each
deriving the embedded Redis's password or the sealing key): the file is written under a
temporary name and linked into place, which fails if it already exists, so every process ends
up with the one value that won and none ever reads a half-written file.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path


def token() -> str:
    """A random secret fit for a password: 32 URL-safe characters, 192 bits."""
    return secrets.token_urlsafe(24)


def new_key() -> str:
    """A fresh encryption key: 32 random bytes, URL-safe base64 (as utils/seal.py takes it)."""
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) and make it 0700: only its owner lists or enters it."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def read_or_create(path: Path, make: Callable[[], str] = token) -> str:
    """The secret in `path`; made with `make()` and written 0600 first if the file is missing.
    A file other users could read is made 0600."""
    path = Path(path)
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(make().strip() + "\n")
        with contextlib.suppress(FileExistsError):  # another process won: its secret counts
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return _read(path)


def _read(path: Path) -> str:
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)
    value = path.read_text().strip()
    if not value:
        raise ValueError(f"{path} is empty: delete it to have a new secret generated")
    return value
