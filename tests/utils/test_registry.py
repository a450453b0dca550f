"""utils.registry: a name is registered once; a second registration names both modules."""

from __future__ import annotations

import types

import pytest

from utils.registry import DuplicateNameError, Registry, UnknownNameError


def _module(name: str, source: str, registry: Registry[object]) -> types.ModuleType:
    """A module named `name` whose body runs `source` with `registry` in scope."""
    mod = types.ModuleType(name)
    mod.registry = registry  # type: ignore[attr-defined]
    exec(compile(source, f"<{name}>", "exec"), mod.__dict__)
    return mod


def test_a_second_registration_names_the_name_and_both_modules() -> None:
    reg: Registry[object] = Registry("signer")
    _module("sites.shop.signing", "registry.add('hmac', object())", reg)
    with pytest.raises(DuplicateNameError) as err:
        _module("sites.other.signing", "registry.add('hmac', object())", reg)
    msg = str(err.value)
    assert "signer 'hmac'" in msg
    assert "first by sites.shop.signing" in msg and "then by sites.other.signing" in msg
    assert (err.value.first, err.value.second) == ("sites.shop.signing", "sites.other.signing")


def test_the_decorator_names_the_module_it_is_used_in() -> None:
    reg: Registry[object] = Registry("gate")
    _module("scheduling.one", "@registry.register('redis')\nclass A: pass", reg)
    with pytest.raises(DuplicateNameError, match=r"first by scheduling\.one, then by tests\.two"):
        _module("tests.two", "@registry.register('redis')\nclass B: pass", reg)


def test_the_first_registration_stays_and_remove_frees_the_name() -> None:
    reg: Registry[str] = Registry("sink")
    reg.add("memo", "first")
    with pytest.raises(DuplicateNameError):
        reg.add("memo", "second")
    assert reg.get("memo") == "first"
    reg.remove("memo")
    with pytest.raises(UnknownNameError):
        reg.get("memo")
    reg.add("memo", "again")
    assert reg.get("memo") == "again"
