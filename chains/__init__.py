"""Chains: endpoint tasks linked into crawl pipelines, run with an id and exact progress.

    from chains import run
    handle = run("demo_social", seeds=[{}], priority=7)
    handle.progress(); handle.wait(timeout=300)
    handle.pause(); handle.resume()   # or chains.pause(run_id) / chains.resume(run_id)
    handle.cancel("wrong seeds")   # or chains.cancel(run_id) from any process

Chain definitions live in `chains/defs/` (one module per business chain, imported by
`load_all()`), or in YAML/JSON files loaded with `load_chain_file`.
"""

from __future__ import annotations

from chains.registry import (
    chain_from_dict,
    define,
    get_chain,
    load_all,
    load_chain_file,
    names,
    register,
)
from chains.runner import RunHandle, cancel, get_run, pause, resume, run
from ledger.model import Chain, Step, StepOptions, step

__all__ = [
    "Chain",
    "RunHandle",
    "Step",
    "StepOptions",
    "cancel",
    "chain_from_dict",
    "define",
    "get_chain",
    "get_run",
    "load_all",
    "load_chain_file",
    "names",
    "pause",
    "register",
    "resume",
    "run",
    "step",
]
