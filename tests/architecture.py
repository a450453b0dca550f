"""A contract type for import-linter: no import cycle between any two project modules.

import-linter's own contracts cover layers (a module imports only from its own layer or
below) and cycles between siblings of one package; a cycle can also run between packages of
one layer (`chains` and `sites`, say), which neither sees. `lint-imports` loads this type from
`pyproject.toml` (`contract_types`); the graph is import-linter's own (grimp), so imports inside
functions count, as they do for every other contract.
"""

from __future__ import annotations

import sys
from typing import Any

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


class AcyclicContract(Contract):
    """Every module of `modules` (and their descendants) takes part in no import cycle."""

    type_name = "acyclic"

    modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        roots = tuple(self.modules)  # type: ignore[arg-type]
        mine = {m for m in graph.modules if m.split(".")[0] in roots}
        cycles = [sorted(c) for c in _strongly_connected(graph, mine) if len(c) > 1]
        return ContractCheck(kept=not cycles, metadata={"cycles": cycles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(f"{len(cycle)} modules import each other in a circle:")
            for module in cycle:
                output.print(f"    {module}")
            output.new_line()


def _strongly_connected(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Tarjan's algorithm over the project's import graph (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0

    def edges(m: str) -> list[str]:
        return sorted(x for x in graph.find_modules_directly_imported_by(m) if x in modules)

    for start in sorted(modules):
        if start in index:
            continue
        work: list[tuple[str, Any]] = [(start, iter(edges(start)))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges(nxt))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                out.append(component)
    return out


if __name__ == "__main__":  # `python -m tests.architecture`: the cycles, if any, one per line
    g = grimp.build_graph(*sys.argv[1:])
    for c in _strongly_connected(g, set(g.modules)):
        if len(c) > 1:
            print(" ".join(sorted(c)))
