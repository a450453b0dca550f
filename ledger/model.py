"""A chain is data: a tree of steps, each an endpoint task plus how its parameters come from
the parent's items. Built with a small DSL (`step(...).then(...)`) or loaded from YAML/JSON,
validated against the endpoints when defined, and serialised into the run record so every
worker sees the same tree.

This module knows endpoints only through a lookup function (`Lookup`): the ledger sits below
the endpoint contract, and `chains` (which loads every site) hands the lookup in.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from exceptions import (
    ChainCycleError,
    ChainDefinitionError,
    MissingMappingError,
    UnknownFieldError,
    UnknownTaskError,
)
from utils.registry import UnknownNameError


class EndpointShape(Protocol):
    """What validation needs of an endpoint: its parameter model and the item types it yields."""

    @property
    def params(self) -> type[BaseModel]: ...

    @property
    def item_types(self) -> tuple[type[BaseModel], ...]: ...


Lookup = Callable[[str], EndpointShape]  # task name -> endpoint; UnknownNameError if none


class StepOptions(BaseModel):
    """Per-step knobs carried into every task the step dispatches."""

    model_config = ConfigDict(extra="forbid")

    priority: int | None = None  # overrides the run's priority for this step (0..9, 9 = first)
    queue: str | None = None  # overrides the site queue
    unique: bool = False  # dispatch each distinct parameter set once per run
    max_pages: int | None = None  # follow-ups (next pages) allowed per first page; None = all
    on: str | None = None  # only parent items of this item type feed this step
    # dedup across runs: skip a task whose parameters were crawled within this many hours
    # (0 = ever); re-crawled ones restart their period (external_interface.dedup)
    skip_seen_hours: float | None = None


@dataclass
class Step:
    task: str
    map: dict[str, str] = field(default_factory=dict)  # child param <- parent item field
    const: dict[str, Any] = field(default_factory=dict)
    options: StepOptions = field(default_factory=StepOptions)
    children: list[Step] = field(default_factory=list)
    id: str = ""

    def then(self, *children: Step) -> Step:
        self.children.extend(children)
        return self

    def walk(self) -> Iterator[Step]:
        yield self
        for c in self.children:
            yield from c.walk()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "task": self.task}
        if self.map:
            d["map"] = dict(self.map)
        if self.const:
            d["const"] = dict(self.const)
        opts = self.options.model_dump(exclude_defaults=True)
        if opts:
            d["options"] = opts
        if self.children:
            d["then"] = [c.to_dict() for c in self.children]
        return d


def step(
    task: str,
    mapping: Mapping[str, str] | None = None,
    /,
    *,
    _id: str = "",
    _const: Mapping[str, Any] | None = None,
    _options: StepOptions | Mapping[str, Any] | None = None,
    **fields: Any,
) -> Step:
    """DSL: `step("demo.h5.user_info", user_id="user_id")` maps child param <- parent field.

    Every keyword is a parameter mapping, whatever its name (`id="post_id"` maps a parameter
    `id`): the step's own settings are the underscored keywords, which no parameter can be
    named (pydantic fields never start with `_`): `_id` (the step's id in counters),
    `_const` (fixed parameters), `_options` (StepOptions). `const=` and `options=` given a
    mapping (never a field name) still mean `_const` and `_options`."""
    own = {"const": _const, "options": _options}
    mapped: dict[str, str] = dict(mapping or {})
    for name, src in fields.items():
        if name in own and isinstance(src, Mapping | StepOptions):
            if own[name] is not None:
                raise ChainDefinitionError(f"step {task!r}: both {name}= and _{name}= given")
            own[name] = src
            continue
        mapped[name] = src
    for name, src in mapped.items():
        if not isinstance(src, str):
            raise ChainDefinitionError(
                f"step {task!r}: parameter {name!r} must map from a parent item field's name, "
                f"got {type(src).__name__} {src!r} (a fixed value goes in _const=)"
            )
    options = own["options"]
    opts = options if isinstance(options, StepOptions) else step_options(task, options or {})
    return Step(task=task, map=mapped, const=dict(own["const"] or {}), options=opts, id=_id)


def step_options(task: str, options: Mapping[str, Any]) -> StepOptions:
    """`StepOptions` from a mapping, with an error that names the step, each wrong option
    (with a "did you mean" for a misspelt one) and the value a known one rejected."""
    known = list(StepOptions.model_fields)
    wrong = [str(UnknownNameError("step option", str(k), known)) for k in options if k not in known]
    if wrong:
        raise ChainDefinitionError(f"step {task!r}: {'; '.join(wrong)}")
    try:
        return StepOptions(**options)
    except ValidationError as exc:
        bad = "; ".join(
            f"option {'.'.join(map(str, e['loc']))!r}: {e['msg']} (got {e.get('input')!r})"
            for e in exc.errors()
        )
        raise ChainDefinitionError(f"step {task!r}: {bad}") from None


class Chain:
    """A validated tree of steps with a name. Steps get unique ids (used in counters)."""

    def __init__(self, name: str, root: Step, *, lookup: Lookup | None = None) -> None:
        if not name or not isinstance(name, str):
            raise ChainDefinitionError("a chain needs a non-empty name")
        self.name = name
        self.root = root
        self._assign_ids()
        self.steps: dict[str, Step] = {s.id: s for s in root.walk()}
        self.parent_of: dict[str, Step | None] = {root.id: None}
        for s in root.walk():
            for c in s.children:
                self.parent_of[c.id] = s
        if lookup is not None:
            self.validate(lookup)

    def _assign_ids(self) -> None:
        seen: set[str] = set()
        stack: set[int] = set()

        def visit(s: Step) -> None:
            if id(s) in stack:
                raise ChainCycleError(f"chain {self.name!r}: step {s.task!r} contains itself")
            stack.add(id(s))
            if not s.id:
                s.id = ".".join(s.task.split(".")[-2:]) if "." in s.task else s.task
            base, n = s.id, 2
            while s.id in seen:
                s.id = f"{base}#{n}"
                n += 1
            seen.add(s.id)
            for c in s.children:
                visit(c)
            stack.discard(id(s))

        visit(self.root)

    def validate(self, get_endpoint: Lookup) -> None:
        """Check every step against the endpoints; raise a ChainDefinitionError."""
        for s in self.root.walk():
            where = f"chain {self.name!r}, step {s.id!r}"
            try:
                spec = get_endpoint(s.task)
            except UnknownNameError as exc:
                raise UnknownTaskError(f"{where}: {exc}") from None
            fields = spec.params.model_fields
            for p in (*s.map, *s.const):
                if p not in fields:
                    own = "; the step's own id is _id=" if p == "id" and p in s.map else ""
                    raise ChainDefinitionError(
                        f"{where}: {s.task} has no parameter {p!r} (has: {', '.join(fields)}){own}"
                    )
            if const_err := _check_consts(spec.params, s):
                raise ChainDefinitionError(f"{where}: {const_err}")
            parent = self.parent_of.get(s.id)
            required = [n for n, f in fields.items() if f.is_required()]
            if parent is None:  # the root's parameters come from the seeds: nothing to map
                for p, src in s.map.items():
                    raise ChainDefinitionError(
                        f"{where}: parameter {p!r} maps from parent field {src!r}, but the "
                        f"root step has no parent (its parameters come from the seeds; a "
                        f"fixed value goes in _const={{{p!r}: ...}})"
                    )
                continue
            for p in required:
                if p not in s.map and p not in s.const:
                    raise MissingMappingError(
                        f"{where}: required parameter {p!r} of {s.task} has no mapping "
                        f'from {parent.task}\'s items (add {p}="<field>")'
                    )
            pspec = get_endpoint(parent.task)
            types = pspec.item_types
            if s.options.on:
                types = tuple(t for t in types if getattr(t, "item_type", "") == s.options.on)
                if not types:
                    raise ChainDefinitionError(
                        f"{where}: on={s.options.on!r} is not an item type of {parent.task}"
                    )
            available = set().union(*(t.model_fields for t in types)) if types else set()
            for p, src in s.map.items():
                if src not in available:
                    raise UnknownFieldError(
                        f"{where}: parameter {p!r} maps from field {src!r}, which no item "
                        f"of {parent.task} has (fields: {', '.join(sorted(available)) or 'none'})"
                    )
            if s.map and not any(all(f in t.model_fields for f in s.map.values()) for t in types):
                # each field is somewhere, but no one item type has them all: fan_out would
                # never send this step
                raise UnknownFieldError(
                    f"{where}: no item type of {parent.task} has all of the fields "
                    f"{sorted(s.map.values())} its parameters map from, so it would never run"
                )

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "root": self.root.to_dict()}

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    def __repr__(self) -> str:
        return f"Chain({self.name!r}, steps={list(self.steps)})"


def _check_consts(params: type[BaseModel], s: Step) -> str | None:
    """Constants must fit their field's type at definition, strictly and as the JSON they
    travel as (`page: true` is no int, `"3"` no number): a lax check would let the worker
    coerce them at trigger time, or fail only then."""
    if not s.const:
        return None
    try:
        raw = orjson.dumps(s.const)
    except TypeError as exc:
        return f"constants are not JSON: {exc}"
    try:
        params.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        for e in exc.errors():
            name = e["loc"][0] if e["loc"] else None
            if name in s.const and e["type"] != "missing":
                return f"constant {name}={s.const[name]!r} is invalid: {e['msg']}"
    return None


# --- loading from data -------------------------------------------------------------------


def chain_from_dict(data: Mapping[str, Any], *, lookup: Lookup | None = None) -> Chain:
    """Two shapes: a tree (`root: {task, map, then: [...]}`) or a graph of named steps
    (`steps: {id: {task, map, next: [ids]}}, root: id`), where cycles are possible and caught."""
    if not isinstance(data, Mapping):
        raise ChainDefinitionError(
            f"a chain definition must be a mapping, got {type(data).__name__}"
        )
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ChainDefinitionError("chain definition has no 'name'")
    if "steps" in data:
        root = _graph_to_tree(name, data["steps"], data.get("root"))
    elif "root" in data:
        root = _tree_step(name, data["root"], "root")
    else:
        raise ChainDefinitionError(f"chain {name!r}: needs 'root' (a tree) or 'steps' (a graph)")
    return Chain(name, root, lookup=lookup)


_STEP_KEYS = {"task", "map", "const", "options", "then", "next", "id"}


def _tree_step(chain: str, d: Any, where: str) -> Step:
    if not isinstance(d, Mapping):
        raise ChainDefinitionError(f"chain {chain!r}: {where} must be a mapping")
    unknown = set(d) - _STEP_KEYS
    if unknown:
        near = {
            str(k): m[0]
            for k in unknown
            if (m := difflib.get_close_matches(str(k), sorted(_STEP_KEYS), n=1))
        }
        if len(unknown) == 1 and near:
            hint = f" (did you mean {next(iter(near.values()))!r}?)"
        elif near:
            hint = (
                " (did you mean "
                + ", ".join(f"{m!r} for {k!r}" for k, m in sorted(near.items()))
                + "?)"
            )
        else:
            hint = f" (a step's keys: {', '.join(sorted(_STEP_KEYS))})"
        raise ChainDefinitionError(
            f"chain {chain!r}: {where} has unknown keys {sorted(unknown)}{hint}"
        )
    if not isinstance(d.get("task"), str):
        raise ChainDefinitionError(f"chain {chain!r}: {where} has no 'task' name")
    for k in ("map", "const"):
        if not isinstance(d.get(k, {}), Mapping):
            raise ChainDefinitionError(f"chain {chain!r}: {where}.{k} must be a mapping")
    if not isinstance(d.get("options", {}), Mapping):
        raise ChainDefinitionError(f"chain {chain!r}: {where}.options must be a mapping")
    try:
        opts = step_options(d["task"], d.get("options", {}))
    except ChainDefinitionError as exc:
        raise ChainDefinitionError(f"chain {chain!r}: {where}: {exc}") from None
    s = Step(
        task=d["task"],
        map={str(k): str(v) for k, v in d.get("map", {}).items()},
        const=dict(d.get("const", {})),
        options=opts,
        id=str(d.get("id", "")),
    )
    kids = d.get("then", [])
    if not isinstance(kids, list):
        raise ChainDefinitionError(f"chain {chain!r}: {where}.then must be a list")
    s.children = [_tree_step(chain, c, f"{where}.then[{i}]") for i, c in enumerate(kids)]
    return s


def _graph_to_tree(chain: str, steps: Any, root: Any) -> Step:
    if not isinstance(steps, Mapping) or not steps:
        raise ChainDefinitionError(f"chain {chain!r}: 'steps' must be a non-empty mapping")
    if root not in steps:
        raise ChainDefinitionError(
            f"chain {chain!r}: 'root' must name one of the steps {list(steps)}"
        )
    for sid, d in steps.items():
        nxt = d.get("next", []) if isinstance(d, Mapping) else []
        for n in nxt:
            if n not in steps:
                raise ChainDefinitionError(f"chain {chain!r}: step {sid!r} -> unknown step {n!r}")

    def build(sid: str, path: tuple[str, ...]) -> Step:
        if sid in path:
            cycle = " -> ".join((*path[path.index(sid) :], sid))
            raise ChainCycleError(f"chain {chain!r} has a cycle: {cycle}")
        d = dict(steps[sid])
        nxt = d.pop("next", [])
        s = _tree_step(chain, {**d, "id": sid}, f"steps.{sid}")
        s.children = [build(n, (*path, sid)) for n in nxt]
        return s

    return build(root, ())


def load_chain_file(path: str | Path, *, lookup: Lookup | None = None) -> Chain:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ChainDefinitionError(f"cannot read chain file {p}: {exc.strerror}") from None
    try:
        data = orjson.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if p.suffix == ".json" else "YAML"
        raise ChainDefinitionError(f"{p}: not valid {kind}: {exc}") from None
    return chain_from_dict(data, lookup=lookup)


def fan_out(
    step_: Step, items: Iterable[tuple[str, Mapping[str, Any]]]
) -> Iterator[dict[str, Any]]:
    """Child parameter dicts for one child step, from the parent's (item_type, item) pairs."""
    for item_type, item in items:
        if step_.options.on and item_type != step_.options.on:
            continue
        if not all(src in item for src in step_.map.values()):
            continue  # this item type does not feed this step
        params = {p: item[src] for p, src in step_.map.items()}
        params.update(step_.const)
        yield params
