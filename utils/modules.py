"""Importing a tree of modules where one broken module must not take the others down.

Site and chain discovery import every module of a package tree. A module that raises at
import (a syntax error, a typo'd name, an invalid `Item`) is recorded as a `BrokenModule`,
named in one line with the file and line to fix and the exception, and the walk goes on with
the rest of the tree: the processes work with every other module.

`load_object("package.module:name")` is the plugin load of the registries that name an
implementation by its path: the module is imported when the implementation is first needed, so
a process that never builds it (a triggering script) does not import it or its libraries.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BrokenModule:
    """A module that failed to import: where to look (`file`, `line`) and what it raised."""

    module: str
    file: str
    line: int
    error: str  # "NameError: name 'x' is not defined"

    def describe(self) -> str:
        """One line: the module, the file and line to fix, the exception."""
        return f"module {self.module} ({self.file}:{self.line}) failed to import: {self.error}"

    def as_dict(self) -> dict[str, str | int]:
        return {"module": self.module, "file": self.file, "line": self.line, "error": self.error}


def _relative(path: str, root: Path | None) -> str:
    if root is not None:
        try:
            return str(Path(path).resolve().relative_to(root))
        except ValueError:
            pass
    return path


def broken_module(
    name: str, exc: BaseException, root: Path | None = None, within: tuple[str, ...] = ()
) -> BrokenModule:
    """The record of `exc` raised while importing module `name`. The file and line: the syntax
    error's, else the deepest frame of the traceback in the tree being imported (`within`:
    its directories; a chain's `define` raises in the library, the line to fix is the
    chain module's), else in the project (`root`), else the deepest frame of all."""
    first = (str(exc).strip().splitlines() or [""])[0]
    error = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    if isinstance(exc, SyntaxError) and exc.filename:
        return BrokenModule(name, _relative(exc.filename, root), exc.lineno or 0, error)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    tree = [f for f in frames if any(str(Path(f.filename).resolve()).startswith(d) for d in within)]
    mine = [f for f in frames if root is not None and _relative(f.filename, root) != f.filename]
    project = [f for f in mine if "site-packages" not in f.filename]
    found = tree or project or frames
    if not found:
        return BrokenModule(name, name, 0, error)
    pick = found[-1]
    return BrokenModule(name, _relative(pick.filename, root), pick.lineno or 0, error)


def import_tree(
    package: str, root: Path | None = None, within: tuple[str, ...] = ()
) -> tuple[list[str], list[BrokenModule]]:
    """Import `package` and every module and package below it; -> (the names imported below
    `package`, the modules broken). A broken package's own modules are not reached (its
    `__init__` is what is broken); a `package` that does not import is the one broken module."""
    names: list[str] = []
    broken: list[BrokenModule] = []
    try:
        pkg = importlib.import_module(package)
    except Exception as exc:
        sys.modules.pop(package, None)
        return names, [broken_module(package, exc, root, within)]
    within = within or tuple(str(Path(d).resolve()) + "/" for d in getattr(pkg, "__path__", []))
    for info in pkgutil.iter_modules(getattr(pkg, "__path__", []), prefix=package + "."):
        if info.ispkg:
            sub, bad = import_tree(info.name, root, within)
            names += [info.name, *sub] if not (bad and bad[0].module == info.name) else []
            broken += bad
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            sys.modules.pop(info.name, None)
            broken.append(broken_module(info.name, exc, root, within))
            continue
        names.append(info.name)
    return names, broken


def load_object(path: str) -> Any:
    """The object a `"package.module:name"` path names, its module imported on first use."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"not a 'package.module:name' path: {path!r}")
    return getattr(importlib.import_module(module), name)
