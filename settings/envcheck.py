"""Report `CHAINCRAWL_*` environment variables that nothing reads.

A misspelled variable (`CHAINCRAWL_MAX_RETRYS`, `CHAINCRAWL_SIGN_KEY_DEMOO`) is silently
ignored by every settings reader: the worker runs on the default and nobody knows. Workers
call `current()` at start and log each problem as a warning, `control.sh config` prints
them. The names come from the settings classes (`config.settings_classes()`: their fields and
aliases) and the per-site families of `config.SITE_VARS` for the sites that exist; the caller
passes those sites and the pool kinds it knows, so this module needs nothing above `config`.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping

from dotenv import dotenv_values

from config import SITE_VARS, settings_classes
from settings.base import PREFIX


def fixed_names() -> set[str]:
    """Every variable with a fixed name: each settings field's `CHAINCRAWL_*` names."""
    return {
        name
        for cls in settings_classes()
        for names in cls.env_names().values()
        for name in names
        if name.startswith(PREFIX)
    }


def set_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """The `CHAINCRAWL_*` variables set (names only: values may be secrets): by default those
    of the environment and of `.env`, which the settings classes and `current()` read too (a
    name only `.env` sets is listed as `NAME (.env)`)."""
    if environ is not None:
        return sorted(n for n in environ if n.startswith(PREFIX))
    dotenv = {n for n in dotenv_values(".env") if n.startswith(PREFIX)}
    names = {n: n for n in os.environ if n.startswith(PREFIX)}
    names.update({n: f"{n} (.env)" for n in dotenv if n not in names})
    return [names[n] for n in sorted(names)]


def _part(allowed: tuple[str, ...] | None) -> str:
    return "|".join(re.escape(v.upper()) for v in allowed) if allowed else "[A-Z0-9_]+?"


def _pattern(template: str, parts: Mapping[str, tuple[str, ...] | None], site: str) -> str:
    out = re.escape(PREFIX + template.upper())
    out = out.replace(r"\{SITE\}", f"(?P<site>{site})")
    for name, allowed in parts.items():
        out = out.replace(r"\{" + name.upper() + r"\}", f"(?:{_part(allowed)})")
    return out + "$"


Parts = Mapping[str, tuple[str, ...] | None]


def site_patterns(
    sites: Iterable[str], parts: Parts | None = None
) -> tuple[list[re.Pattern[str]], list[re.Pattern[str]]]:
    """(names of the known sites' variables, the same families for any site). `parts` gives
    the values of parts a family leaves open (the pool kinds a process knows)."""
    known = "|".join(re.escape(s.upper()) for s in sorted(sites, key=len, reverse=True))
    ok, any_site = [], []
    for var in SITE_VARS.values():
        vparts = {k: v or (parts or {}).get(k) for k, v in var.parts.items()}
        if var.default:
            ok.append(re.compile(_pattern(var.default, vparts, "")))
        if known:
            ok.append(re.compile(_pattern(var.template, vparts, known)))
        any_site.append(re.compile(_pattern(var.template, vparts, "[A-Z0-9_]+")))
    return ok, any_site


def problems(
    sites: Iterable[str], environ: Mapping[str, str] | None = None, parts: Parts | None = None
) -> list[str]:
    """One line per `CHAINCRAWL_*` variable nothing reads, with the likely intended name.
    Only names are shown: values may be secrets."""
    env = os.environ if environ is None else environ
    sites = sorted(set(sites))
    fixed = fixed_names()
    ok, any_site = site_patterns(sites, parts)
    out = []
    for name in sorted(n for n in env if n.startswith(PREFIX)):
        if name in fixed or any(p.match(name) for p in ok):
            continue
        candidates = [c.removeprefix(PREFIX) for c in sorted(fixed) + _site_names(sites, parts)]
        close = difflib.get_close_matches(name.removeprefix(PREFIX), candidates, n=1, cutoff=0.75)
        hint = [PREFIX + c for c in close]
        m = next((m for p in any_site if (m := p.match(name))), None)
        if m and _site_typo(m, hint, sites):
            site = m["site"].lower()
            near = difflib.get_close_matches(site, sites, n=1)
            fix = name[: m.start("site")] + near[0].upper() + name[m.end("site") :] if near else ""
            msg = f"{name}: no site {site!r}" + (
                f"; did you mean {fix}?" if near else f" (sites: {', '.join(sites)})"
            )
        else:
            msg = f"{name} is not a chaincrawl setting" + (
                f"; did you mean {hint[0]}?" if hint else " (README: Configuration)"
            )
        out.append(msg)
    return out


def _site_typo(m: re.Match[str], hint: list[str], sites: list[str]) -> bool:
    """Whether a name of a per-site family is wrong in its site (not in its family): no other
    name is close, or the closest is the same family's for a known site."""
    if not hint:
        return True
    h = m.re.match(hint[0])
    return bool(h and h["site"].lower() in sites)


def _site_names(sites: list[str], parts: Parts | None = None) -> list[str]:
    """Concrete per-site names for the hints (families with a part still open left out)."""
    names = []
    for var in SITE_VARS.values():
        vparts = {k: v or (parts or {}).get(k) for k, v in var.parts.items()}
        if any(v is None for v in vparts.values()):
            continue
        combos: list[dict[str, str]] = [{}]
        for part, allowed in vparts.items():
            combos = [{**c, part: v} for c in combos for v in allowed or ()]
        for c in combos:
            names += [var.name(s, **c) for s in sites]
            if d := var.default_name(**c):
                names.append(d)
    return names


def current(
    sites: Iterable[str], kinds: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> list[str]:
    """`problems()` for this process: the sites it loaded, the pool kinds it knows of, and
    the variables of `.env` (which the settings classes read too) under the environment's."""
    if environ is None:
        environ = {**{k: v or "" for k, v in dotenv_values(".env").items()}, **os.environ}
    kinds = tuple(sorted(kinds))
    return problems(sites, environ, {"kind": kinds} if kinds else None)
