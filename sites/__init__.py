"""Endpoint modules, one per site endpoint: `sites/<site>/<platform>/<endpoint>.py`.

`load_all()` imports every module under this package (and the packages named in
CHAINCRAWL_EXTRA_SITE_PACKAGES), so a new endpoint module is picked up with no registration
anywhere else. Celery's autodiscover_tasks would only look for `tasks.py` modules.
`get_endpoint` is the lookup the rest of the house uses: every site loaded first.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading

from config import get_settings
from lifecycle.endpoints import EndpointSpec, iter_endpoints
from lifecycle.endpoints import get_endpoint as registered

_lock = threading.RLock()
_imported: set[str] = set()


def _import_tree(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    names = []
    for info in pkgutil.walk_packages(pkg.__path__, prefix=package + "."):
        importlib.import_module(info.name)
        names.append(info.name)
    return names


def load_all() -> list[str]:
    """Import every endpoint package not imported yet in this process; returns module names."""
    wanted = [__name__, *(p.strip() for p in get_settings().extra_site_packages.split(","))]
    names: list[str] = []
    with _lock:
        for package in filter(None, wanted):
            if package not in _imported:
                _imported.add(package)  # first: a module of the tree may ask for the lookup
                try:
                    names += _import_tree(package)
                except BaseException:
                    _imported.discard(package)
                    raise
    return names


def get_endpoint(name: str) -> EndpointSpec:
    """The endpoint of a task name, every site loaded (UnknownNameError, with a "did you
    mean", when no site has it)."""
    load_all()
    return registered(name)


def sites() -> list[str]:
    """Site names (queue names) of the loaded endpoints."""
    load_all()
    return sorted({spec.queue for spec in iter_endpoints()})
