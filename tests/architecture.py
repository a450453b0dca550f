"""The import graph of the whole project for import-linter, and a contract: no import cycle.

The project's top-level modules (`base_task.py`, `config.py`, `exceptions.py`, `worker.py`) are
no packages, and grimp builds graphs of packages only: `ProjectGraphBuilder` adds each `*.py`
file beside `pyproject.toml` to the graph of the packages, with the imports it makes (read with
`ast`, inside functions too) and the imports made of it. `python -m tests.architecture lint`
runs `lint-imports` on that graph (`./control.sh lint` and CI do).

import-linter's own contracts cover layers (a module imports only from its own layer or
below) and cycles between siblings of one package; a cycle can also run between packages of
one layer (`chains` and `sites`, say), which neither sees. `AcyclicContract` finds those;
`lint-imports` loads it from `pyproject.toml` (`contract_types`).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any, cast

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck

ROOT = Path(__file__).resolve().parent.parent


def top_level_modules(root: Path = ROOT) -> list[str]:
    """The project's modules that are single files at the top level."""
    return sorted(p.stem for p in root.glob("*.py") if p.stem.isidentifier())


def build_graph(*names: str, cache_dir: str | None = None, **options: Any) -> grimp.ImportGraph:
    """grimp's graph of the packages among `names`, with the top-level modules among them."""
    modules = [n for n in names if (ROOT / f"{n}.py").is_file()]
    packages = [n for n in names if n not in modules]
    graph = grimp.build_graph(*packages, include_external_packages=True, cache_dir=cache_dir,
                              **options)  # fmt: skip
    imported_by = {m: _importers(graph, m) for m in modules if m in graph.modules}
    for m in [m for m in graph.modules if graph.is_module_squashed(m)]:
        graph.remove_module(m)  # the other external packages: no contract is about them
    for m in modules:
        graph.add_module(m)
    for details in imported_by.values():
        for d in details:
            graph.add_import(**d)
    for m in modules:
        for imported, line, text in _imports_of(ROOT / f"{m}.py", graph.modules):
            graph.add_import(importer=m, imported=imported, line_number=line, line_contents=text)
    return graph


def _importers(graph: grimp.ImportGraph, module: str) -> list[dict[str, Any]]:
    out = []
    for importer in graph.find_modules_that_directly_import(module):
        for d in graph.get_import_details(importer=importer, imported=module):
            out.append({"importer": importer, "imported": module, "line_number": d["line_number"],
                        "line_contents": d["line_contents"]})  # fmt: skip
    return out


def _imports_of(path: Path, known: set[str]) -> list[tuple[str, int, str]]:
    """The project modules a file imports: `from a.b import c` is `a.b.c` if that is a module."""
    lines = path.read_text().splitlines()
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                     else node.module for a in node.names]  # fmt: skip
        else:
            continue
        for name in names:
            while name and name not in known:  # `import a.b` of a module a.b.c's package
                name = name.rpartition(".")[0]
            if name:
                out.append((name, node.lineno, lines[node.lineno - 1].strip()))
    return out


class ProjectGraphBuilder:
    """import-linter's graph builder (its `GRAPH_BUILDER` setting) with the top-level modules."""

    def build(self, root_package_names: list[str], cache_dir: str | None,
              include_external_packages: bool = False,
              exclude_type_checking_imports: bool = False) -> grimp.ImportGraph:  # fmt: skip
        return build_graph(*root_package_names, *top_level_modules(), cache_dir=cache_dir,
                           exclude_type_checking_imports=exclude_type_checking_imports)  # fmt: skip


class AcyclicContract(Contract):
    """Every module of `modules` (and their descendants) takes part in no import cycle."""

    type_name = "acyclic"

    modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        roots = tuple(cast("list[str]", self.modules))
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


def lint() -> None:
    """`lint-imports` with the project's graph (its command line: `lint ARGS...`)."""
    from importlinter import cli  # configures import-linter's settings on import
    from importlinter.application.app_config import settings

    settings.configure(GRAPH_BUILDER=ProjectGraphBuilder())
    sys.argv = ["lint-imports", *sys.argv[2:]]
    sys.exit(cli.lint_imports_command())


if __name__ == "__main__":
    # `python -m tests.architecture lint [lint-imports args]`: the contracts on the whole project;
    # `python -m tests.architecture NAME...`: the cycles among those packages and top-level
    # modules, if any, one per line
    if sys.argv[1:2] == ["lint"]:
        lint()
    g = build_graph(*sys.argv[1:])
    for c in _strongly_connected(g, set(g.modules)):
        if len(c) > 1:
            print(" ".join(sorted(c)))
