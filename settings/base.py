"""The base every chaincrawl settings class subclasses: one way to read configuration.

A setting is an environment variable `CHAINCRAWL_<FIELD>` (or a line of `.env`), read by a
pydantic-settings class (`config.Settings` or one of this package); `config.settings_classes()` lists them all,
so the unknown-variable check (`settings/envcheck.py`) and the configuration reference
(`settings/reference.py`) know every name without a hand-written list.

What the base adds to pydantic-settings:
- a value that does not parse is a `SettingError` (a `ConfigError` and a `ValueError`)
  naming the variable, never its value (which may be a secret); JSON-valued fields (lists,
  objects) are parsed here, so a bad JSON value is reported the same way;
- `current()` / `forget()`: the process's instance, built on first use, and a reset for tests
  that change the environment;
- `from_environ(mapping)`: the settings a given environment would give (another process's).
"""

from __future__ import annotations

import functools
import json
import threading
import typing
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from types import UnionType
from typing import Any, Self

from pydantic import AliasChoices, BaseModel, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)
from pydantic_settings.sources.utils import parse_env_vars

from exceptions import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "CHAINCRAWL_"

# the environment `from_environ` reads instead of the process's (None: the process's)
_environ: ContextVar[Mapping[str, str] | None] = ContextVar("chaincrawl_environ", default=None)
_current: dict[type[ChaincrawlSettings], ChaincrawlSettings] = {}
_current_lock = threading.Lock()


class SettingError(ConfigError, ValueError):
    """A variable's value does not parse. A ValueError too, as pydantic's own errors are, so
    code that caught those catches this."""


class _MappingSource(EnvSettingsSource):
    """The environment source, reading a given mapping instead of `os.environ`."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._mapping = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(
            self._mapping, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )


class ChaincrawlSettings(BaseSettings):
    """Variables `CHAINCRAWL_<FIELD>` (a subclass may narrow the prefix, or give a field its
    names with `validation_alias`), from the environment over `.env`; other variables are
    ignored here and judged by `settings/envcheck.py`."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_file=".env",
        extra="ignore",
        populate_by_name=True,
        enable_decoding=False,  # JSON is parsed by `_decode_json`, so errors name the variable
    )

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:  # `from None`: pydantic's text repeats the values
            raise SettingError(type(self).explain(exc)) from None
        except SettingsError as exc:
            raise SettingError(f"{type(self).__name__}: {exc}") from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _environ.get()
        if environ is not None:  # from_environ(): that mapping only, no `.env`
            return init_settings, _MappingSource(settings_cls, environ)
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    @field_validator("*", mode="before")
    @classmethod
    def _decode_json(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str) and info.field_name in _json_fields(cls):
            try:
                return json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not valid JSON ({exc})") from None
        return value

    # --- the process's instance ---------------------------------------------------------------

    @classmethod
    def current(cls) -> Self:
        """This process's settings, read from the environment on first use."""
        found = _current.get(cls)
        if found is None:
            with _current_lock:
                found = _current.get(cls)
                if found is None:
                    found = _current[cls] = cls()
        return typing.cast(Self, found)

    @classmethod
    def forget(cls) -> None:
        """Drop the cached instance (tests that change the environment call this)."""
        _current.pop(cls, None)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Self:
        """The settings `environ` gives, with nothing from this process's environment or
        `.env` (the environment of a process about to be started, a test's mapping)."""
        token = _environ.set(environ)
        try:
            return cls()
        finally:
            _environ.reset(token)

    # --- names ------------------------------------------------------------------------------

    @classmethod
    def env_names(cls) -> dict[str, tuple[str, ...]]:
        """Field -> the variables it is read from, the chaincrawl name first."""
        return {name: _names(cls, name, f) for name, f in cls.model_fields.items()}

    @classmethod
    def explain(cls, exc: ValidationError) -> str:
        """A validation error as `VARIABLE: what is wrong; ...`, without the values."""
        names = cls.env_names()
        lines = []
        for err in exc.errors(include_url=False, include_input=False):
            loc = str(err["loc"][0]) if err["loc"] else ""
            where = names[loc][0] if loc in names else loc or cls.__name__
            lines.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
        return "; ".join(lines)


def _names(cls: type[BaseSettings], name: str, f: FieldInfo) -> tuple[str, ...]:
    alias = f.validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(c for c in alias.choices if isinstance(c, str))
    if isinstance(alias, str):
        return (alias,)
    return ((str(cls.model_config.get("env_prefix", "")) + name).upper(),)


@functools.cache
def _json_fields(cls: type[BaseSettings]) -> frozenset[str]:
    """Fields whose variable holds JSON: lists, dicts, models."""
    return frozenset(n for n, f in cls.model_fields.items() if _is_complex(f.annotation))


def _is_complex(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is UnionType:
        return any(_is_complex(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is typing.Annotated:
        return _is_complex(typing.get_args(tp)[0])
    if origin in (list, dict, tuple, set, frozenset):
        return True
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def forget_all() -> None:
    """Drop every cached settings instance."""
    _current.clear()


def iter_fields(cls: type[ChaincrawlSettings]) -> Iterator[tuple[str, tuple[str, ...], FieldInfo]]:
    """(field, its variables, its FieldInfo) in declaration order."""
    names = cls.env_names()
    for name, f in cls.model_fields.items():
        yield name, names[name], f
