"""`torture.local.emit` -> `torture.local.typed`: a child whose mapped parameters may fail its
schema at run time (the parent's item says "abc" where the child wants an int)."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint


class EmitParams(Params):
    values: list[str]


class Value(Item):
    item_type: ClassVar[str] = "torture.value"
    key_fields: ClassVar[tuple[str, ...]] = ("value",)
    store: ClassVar[bool] = False
    value: str


class TypedParams(Params):
    n: int


class Number(Item):
    item_type: ClassVar[str] = "torture.number"
    key_fields: ClassVar[tuple[str, ...]] = ("n",)
    n: int


@endpoint(EmitParams, items=[Value], name="torture.local.emit")
def emit(ctx: Context, p: EmitParams) -> Outputs:
    for v in p.values:
        yield Value(value=v)


@endpoint(TypedParams, items=[Number], name="torture.local.typed")
def typed(ctx: Context, p: TypedParams) -> Outputs:
    yield Number(n=p.n)
