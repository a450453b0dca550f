"""Endpoint modules, one per site endpoint: `sites/<site>/<platform>/<endpoint>.py`.

`load_all()` imports every module under this package (and the packages named in
CHAINCRAWL_EXTRA_SITE_PACKAGES), so a new endpoint module is picked up with no registration
anywhere else. Celery's autodiscover_tasks would only look for `tasks.py` modules.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading

from config import get_settings

_lock = threading.Lock()
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
    import base_task

    wanted = [__name__, *(p.strip() for p in get_settings().extra_site_packages.split(","))]
    names: list[str] = []
    with _lock:
        for package in filter(None, wanted):
            if package not in _imported:
                names += _import_tree(package)
                _imported.add(package)
        base_task._loaded.set()
    return names


def sites() -> list[str]:
    """Site names (queue names) of the loaded endpoints."""
    from base_task import iter_endpoints

    load_all()
    return sorted({spec.queue for spec in iter_endpoints()})
