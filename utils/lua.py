"""Lua scripts live in `.lua` files beside the Python module that runs them (readable,
highlighted, diffable). `script()` reads one, with `-- include: other.lua` lines replaced by
that file (a path from the including script's folder: `../utils/wake.lua` for a fragment
scripts of several packages share); `load_lua()` joins several in order. Either way a fragment
two scripts share (a prologue, a loop) is written once."""

from __future__ import annotations

import functools
import re
from pathlib import Path

_INCLUDE = re.compile(r"^--\s*include:\s*(\S+)\s*$", re.MULTILINE)


@functools.cache
def script(beside: str, name: str) -> str:
    """The source of `name` in the folder of the module file `beside` (pass `__file__`)."""
    folder = Path(beside).resolve().parent
    return _expand(folder, name, ())


def load_lua(module_file: str, *names: str) -> str:
    """The scripts `names` beside `module_file` (the caller's `__file__`), joined in order."""
    return "\n".join(script(module_file, name) for name in names)


def _expand(folder: Path, name: str, seen: tuple[str, ...]) -> str:
    if name in seen:
        raise ValueError(f"Lua include cycle: {' -> '.join((*seen, name))}")
    text = (folder / name).read_text()
    return _INCLUDE.sub(lambda m: _expand(folder, m.group(1), (*seen, name)).rstrip("\n"), text)
