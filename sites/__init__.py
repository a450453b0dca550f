"""Endpoint modules, one per site endpoint: `sites/<site>/<platform>/<endpoint>.py`.

`load_all()` imports every module under this package (and the packages named in
CHAINCRAWL_EXTRA_SITE_PACKAGES), so a new endpoint module is picked up with no registration
anywhere else. Celery's autodiscover_tasks would only look for `tasks.py` modules.
`get_endpoint` is the lookup the rest of the house uses: every site loaded first.

A module that fails at import is skipped, not fatal: it is logged in one line (the module, its
file and line, the exception) and kept in `broken()`, and the process goes on with every other
site; workers publish it (broker/workers.py), `control.sh status` lists it and the
`module_broken` alert fires for it.
"""

from __future__ import annotations

import logging
import threading

from config import ROOT, get_settings
from lifecycle.endpoints import EndpointSpec, iter_endpoints
from lifecycle.endpoints import get_endpoint as registered
from utils.modules import BrokenModule, import_tree
from utils.registry import UnknownNameError

log = logging.getLogger("chaincrawl.sites")
_lock = threading.RLock()
_imported: set[str] = set()
_broken: dict[str, BrokenModule] = {}


def load_all() -> list[str]:
    """Import every endpoint package not imported yet in this process; returns module names."""
    wanted = [__name__, *(p.strip() for p in get_settings().extra_site_packages.split(","))]
    names: list[str] = []
    with _lock:
        for package in filter(None, wanted):
            if package not in _imported:
                _imported.add(package)  # first: a module of the tree may ask for the lookup
                try:
                    done, bad = import_tree(package, ROOT)
                except BaseException:
                    _imported.discard(package)
                    raise
                names += done
                for b in bad:
                    _broken[b.module] = b
                    log.error("site %s; every other site works", b.describe())
    return names


def broken() -> list[BrokenModule]:
    """The site modules that failed to import in this process (every site loaded first)."""
    load_all()
    return sorted(_broken.values(), key=lambda b: b.module)


def get_endpoint(name: str) -> EndpointSpec:
    """The endpoint of a task name, every site loaded (UnknownNameError, with a "did you
    mean", when no site has it). When the module that would define it failed to import, the
    error names that module and its exception instead: a "did you mean" another endpoint of
    the site would send the reader to fix the wrong name."""
    load_all()
    try:
        return registered(name)
    except UnknownNameError as exc:
        if bad := _broken_module_of(name):
            exc.args = (f"unknown task {name!r}: its site {bad.describe()}",)
        raise


def _broken_module_of(task: str) -> BrokenModule | None:
    """The broken module that would have defined `task` by its default name (`sites.<task>`),
    or the broken package above it (a site's or platform's `__init__`)."""
    module = f"{__name__}.{task}"
    for b in _broken.values():
        if module == b.module or module.startswith(b.module + "."):
            return b
    return None


def sites() -> list[str]:
    """Site names (queue names) of the loaded endpoints."""
    load_all()
    return sorted({spec.queue for spec in iter_endpoints()})
