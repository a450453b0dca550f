"""Chains by name. Modules under `chains/defs/` call `define(...)` at import time.

Every chain is validated against the endpoints when it is defined or loaded from a file (unknown
task with a "did you mean", a required parameter with no mapping, a mapping from a field the
parent's items lack, a bad constant, a cycle), with every site loaded first.

A chain module that fails at import (a definition error included) is logged in one line with
its file and line and kept in `broken()`; every other chain still loads, and asking for a
chain that module would have defined says which module failed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sites
from config import ROOT, get_settings
from exceptions import UnknownChainError
from ledger import model
from ledger.model import Chain, Step
from utils.modules import BrokenModule, import_tree
from utils.registry import Registry, UnknownNameError

log = logging.getLogger("chaincrawl.chains")
_broken: list[BrokenModule] = []
_chains: Registry[Chain] = Registry("chain")
_lock = threading.Lock()
_loaded = False


def register(chain: Chain) -> Chain:
    _chains.add(chain.name, chain)
    return chain


def define(name: str, root: Step) -> Chain:
    """Define, validate and register a chain."""
    return register(Chain(name, root, lookup=sites.get_endpoint))


def chain_from_dict(data: Mapping[str, Any], *, validate: bool = True) -> Chain:
    """A chain from its data form (a tree or a graph of named steps), validated."""
    return model.chain_from_dict(data, lookup=sites.get_endpoint if validate else None)


def load_chain_file(path: str | Path, *, validate: bool = True) -> Chain:
    """A chain from a YAML or JSON file, validated."""
    return model.load_chain_file(path, lookup=sites.get_endpoint if validate else None)


def load_all() -> None:
    global _loaded
    with _lock:
        if _loaded:
            return
        _loaded = True
    packages = ["chains.defs"]
    packages += [p.strip() for p in get_settings().extra_chain_packages.split(",") if p.strip()]
    for package in packages:
        for b in import_tree(package, ROOT)[1]:
            _broken.append(b)
            log.error(
                "chain %s; the chains it defines are unknown, every other chain module works",
                b.describe(),
            )


def broken() -> list[BrokenModule]:
    """The chain modules that failed to import in this process."""
    load_all()
    return list(_broken)


def get_chain(name: str) -> Chain:
    load_all()
    try:
        return _chains.get(name)
    except UnknownNameError as exc:
        why = "".join(f"; chain {b.describe()}" for b in _broken)
        raise UnknownChainError(f"{exc}{why}") from None


def names() -> list[str]:
    load_all()
    return _chains.names()
