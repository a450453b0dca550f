"""Chains by name. Modules under `chains/defs/` call `define(...)` at import time."""

from __future__ import annotations

import importlib
import pkgutil
import threading

from chains.model import Chain, Step
from config import get_settings
from exceptions import UnknownChainError
from utils.registry import Registry, UnknownNameError

_chains: Registry[Chain] = Registry("chain")
_lock = threading.Lock()
_loaded = False


def register(chain: Chain) -> Chain:
    _chains.add(chain.name, chain)
    return chain


def define(name: str, root: Step) -> Chain:
    """Define, validate and register a chain (validation imports the endpoint modules)."""
    return register(Chain(name, root))


def load_all() -> None:
    global _loaded
    with _lock:
        if _loaded:
            return
        _loaded = True
    packages = ["chains.defs"]
    packages += [p.strip() for p in get_settings().extra_chain_packages.split(",") if p.strip()]
    for package in packages:
        pkg = importlib.import_module(package)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=package + "."):
            importlib.import_module(info.name)


def get_chain(name: str) -> Chain:
    load_all()
    try:
        return _chains.get(name)
    except UnknownNameError as exc:
        raise UnknownChainError(str(exc)) from None


def names() -> list[str]:
    load_all()
    return _chains.names()
