"""The endpoint contract's data: parameter and item schemas, and the registry of endpoints.

A leaf of `base_task`: the context, the task class and the batch runner all build on it, and it
builds on nothing of theirs.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from exceptions import ParamsError
from external_interface.storage.routing import configure_type
from utils.registry import Registry, UnknownNameError

RESOURCES_QUEUE = "resources"  # tasks named `resources.*` (pool production helpers)
DEFAULT_QUEUE = "default"  # tasks no endpoint declares
# `resources=["browser"]`: the endpoint renders pages (`ctx.render`). Not a provider: the
# browser is this process's pool, and the other resources are lent to each page it renders.
BROWSER = "browser"


class Params(BaseModel):
    """An endpoint's input. Unknown fields are rejected so a typo in a chain mapping shows."""

    model_config = ConfigDict(extra="forbid")


class Item(BaseModel):
    """An endpoint's output record. `item_type` names its collection; `key_fields` its identity
    (sinks upsert by them, so a redelivered task never duplicates an item).

    `history_fields`: fields whose every version the sinks that can keep (postgres, mongo,
    jsonl) keep with the interval it held; `search_fields`: fields the postgres sink indexes for
    full-text search. Both register the type's storage policy (`configure_type`) when the class
    is defined; a dotted path names a field inside a field (`stats.views`)."""

    model_config = ConfigDict(extra="forbid")
    item_type: ClassVar[str] = ""
    key_fields: ClassVar[tuple[str, ...]] = ()
    store: ClassVar[bool] = True  # False: feeds child steps only (e.g. a captcha challenge)
    history_fields: ClassVar[tuple[str, ...]] = ()
    search_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if not cls.item_type:
            return  # an abstract intermediate class
        missing = [k for k in cls.key_fields if k not in cls.model_fields]
        if not cls.key_fields or missing:
            raise TypeError(
                f"Item {cls.__name__}: key_fields must name fields of the item (missing: {missing})"
            )
        declared = {"history_fields": cls.history_fields, "search_fields": cls.search_fields}
        for attr, names in declared.items():
            if isinstance(names, str):
                raise TypeError(
                    f"Item {cls.__name__}: {attr} must be a tuple of names, not a string"
                )
            unknown = [n for n in names if n.split(".", 1)[0] not in cls.model_fields]
            if unknown:
                raise TypeError(
                    f"Item {cls.__name__}: {attr} names {unknown}, not fields of the item "
                    f"(fields: {', '.join(cls.model_fields)})"
                )
        if cls.history_fields or cls.search_fields:
            configure_type(
                cls.item_type,
                track=cls.history_fields or None,
                search=cls.search_fields or None,
            )


@dataclass
class Follow:
    """A follow-up of the same endpoint and step, e.g. the next page."""

    params: dict[str, Any]


Output = Item | Follow
Outputs = Iterable[Output]


@dataclass
class EndpointSpec:
    """One endpoint as `@endpoint` declared it (`task` is its Celery task)."""

    name: str
    site: str
    platform: str
    fn: Callable[..., Outputs | None]
    params: type[Params]
    item_types: tuple[type[Item], ...]
    resources: dict[str, str]
    max_retries: int | None = None
    deadline: float | None = None
    request_timeout: float | None = None
    queue: str = ""
    decode_errors: str = "replace"  # undecodable text: "replace" (counted, warned) or "strict"
    fetcher: str = ""  # "impersonate[:browser]", "requests"...; "": the process's (fetch/select.py)
    render: str = ""  # "auto": fetched or rendered as learnt per URL pattern (fetch/adaptive.py)
    must_yield: bool = False  # a page that yields nothing fails (EmptyPage); else counted `empty`
    task: Any = None

    @property
    def renders(self) -> bool:
        """Whether the endpoint asked for the browser (`resources=["browser"]`)."""
        return BROWSER in self.resources

    def validate_params(self, data: Any, *, strict: bool = False) -> Params:
        """Params or a ParamsError naming the task, the field and what is wrong (an unknown
        field with a "did you mean"). `strict`: as the JSON the parameters travel as, with no
        coercion (`"2"` is no int, `true` no page number): how seeds are checked, as strictly
        as a chain's constants; children mapped from item fields are validated laxly."""
        if isinstance(data, self.params):
            return data
        if not isinstance(data, Mapping):
            raise ParamsError(
                f"{self.name}: parameters must be an object, got {type(data).__name__}"
            )
        try:
            if strict:
                try:
                    raw = orjson.dumps(data)
                except TypeError as exc:
                    raise ParamsError(f"{self.name}: parameters are not JSON: {exc}") from None
                return self.params.model_validate_json(raw, strict=True)
            return self.params.model_validate(data)
        except ValidationError as exc:
            raise ParamsError(f"{self.name}: {describe(exc, self.params)}") from None


# pydantic error types whose input says nothing more (the field is absent, or is the name)
_NO_INPUT = frozenset({"missing", "extra_forbidden"})
SHOWN_INPUT = 40  # characters of a rejected value quoted in the message


def shown_input(value: Any) -> str:
    """A rejected value as JSON (seeds are written so: `"2"` is a string, `true` no number),
    cut to SHOWN_INPUT characters."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= SHOWN_INPUT else text[: SHOWN_INPUT - 3] + "..."


def describe(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """A pydantic error as one line naming the fields (at most five) and the value each
    rejected (`field 'page': Input should be a valid integer (got "2")`: why a page number
    that looks right is refused); an unknown field of `model` gets a "did you mean" from its
    fields."""
    parts = []
    for e in exc.errors()[:5]:
        loc = ".".join(str(x) for x in e["loc"]) or "(root)"
        msg = e["msg"]
        if e["type"] not in _NO_INPUT and "input" in e:
            msg += f" (got {shown_input(e['input'])})"
        if e["type"] == "extra_forbidden" and model is not None and len(e["loc"]) == 1:
            known = list(model.model_fields)
            near = difflib.get_close_matches(str(e["loc"][0]), known, n=1, cutoff=0.6)
            msg = "unknown field" + (
                f"; did you mean {near[0]!r}?"
                if near
                else f" (fields: {', '.join(known) or 'none'})"
            )
        parts.append(f"field {loc!r}: {msg}")
    return "; ".join(parts)


ENDPOINTS: Registry[EndpointSpec] = Registry("task")


def get_endpoint(name: str) -> EndpointSpec:
    """The endpoint spec by task name (UnknownNameError with a "did you mean" if none).
    Only endpoints already imported are known: `sites.load_all()` imports every site."""
    return ENDPOINTS.get(name)


def iter_endpoints() -> Iterator[EndpointSpec]:
    for n in ENDPOINTS.names():
        yield ENDPOINTS.get(n)


def queue_for(name: str) -> str:
    """The queue a task is sent to: its endpoint's (the site's unless it sets one),
    `resources` for pool production helpers, `default` for a task no endpoint declares."""
    if name.startswith(RESOURCES_QUEUE + "."):
        return RESOURCES_QUEUE
    try:
        return ENDPOINTS.get(name).queue
    except UnknownNameError:
        return DEFAULT_QUEUE


def route(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> dict:
    """Celery's router signature around `queue_for` (the app's `task_routes`)."""
    return {"queue": queue_for(name)}
