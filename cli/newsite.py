"""`control.sh new-site SITE PLATFORM ENDPOINT [--kind list|detail|api]`: an endpoint module
of the kind asked, its item type in the site's shared `items.py`, the site's base URL from a
per-site setting, and a parser test that replays a recorded page.

    list     an HTML page of entries with a next-page link      {"page": 1}
    detail   one HTML page about one thing                       {"id": "..."}
    api      a JSON answer with a list and the next page         {"page": 1}

Nothing a user wrote is overwritten: an endpoint module or test that exists stops the command
before anything is written; a site package, platform package or `items.py` that exists is kept
(an item class it lacks is appended to `items.py`, and the command says so).
"""

from __future__ import annotations

import argparse
import keyword
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from cli import UserError
from cli.parser import SITE_KINDS
from config import ROOT
from external_interface.fetch.mock import fixture_dir
from settings.sitevars import SITE_VARS

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
KINDS = SITE_KINDS

SITE_INIT = '''"""Site {site}: endpoints under sites/{site}/<platform>/, item types in sites/{site}/items.py."""

from __future__ import annotations

from base_task import site_env
from exceptions import ConfigError

DEFAULT_BASE_URL = "{base_url}"


def base_url() -> str:
    """Where the site lives: {env} when set, else DEFAULT_BASE_URL."""
    url = site_env("base_url", "{site}") or DEFAULT_BASE_URL
    if not url:
        raise ConfigError("site {site} has no base URL: set {env}")
    return url.rstrip("/")
'''

ITEMS_HEAD = '''"""Item types of site {site}, shared by its endpoints (a list page and a detail page may yield
the same type)."""

from __future__ import annotations

from typing import ClassVar

from base_task import Item
'''

ITEM_CLASS = """

class {cls}(Item):
    item_type: ClassVar[str] = "{site}.{item}"
    key_fields: ClassVar[tuple[str, ...]] = ("id",)

    id: str
    title: str
    url: str
"""

PLATFORM_INIT = '''"""{site} {platform} endpoints."""
'''

HEAD = '''"""{site} {platform}: {endpoint}. TODO: say in one line what this page is."""

from __future__ import annotations
{stdlib}
from base_task import Context, Outputs, Params, endpoint
from sites.{site} import base_url
from sites.{site}.items import {cls}
'''

LIST = (
    HEAD
    + """

class {camel}Params(Params):
    page: int = 1


@endpoint({camel}Params, items=[{cls}])
def {endpoint}(ctx: Context, p: {camel}Params) -> Outputs:
    # the path, parameters and selectors are the template's guesses: edit them to the site's
    resp = ctx.get(f"{{base_url()}}/{endpoint}", params={{"page": p.page}})
    for row in resp.css("div.item"):
        link = row.css("a")
        yield {cls}(
            id=row.attrib.get("data-id", ""),
            title=link.css("::text").get(default="").strip(),
            url=urljoin(resp.url, link.attrib.get("href", "")),
        )
    if resp.css("a.next"):
        yield ctx.follow(page=p.page + 1)
"""
)

DETAIL = (
    HEAD
    + """

class {camel}Params(Params):
    id: str


@endpoint({camel}Params, items=[{cls}])
def {endpoint}(ctx: Context, p: {camel}Params) -> Outputs:
    # the path, parameters and selectors are the template's guesses: edit them to the site's
    resp = ctx.get(f"{{base_url()}}/{endpoint}/{{p.id}}")
    yield {cls}(id=p.id, title=resp.css("h1::text").get(default="").strip(), url=resp.url)
"""
)

API = (
    HEAD
    + """

class {camel}Params(Params):
    page: int = 1


@endpoint({camel}Params, items=[{cls}])
def {endpoint}(ctx: Context, p: {camel}Params) -> Outputs:
    # the path, parameters and selectors are the template's guesses: edit them to the site's
    resp = ctx.get(f"{{base_url()}}/api/{endpoint}", params={{"page": p.page}})
    data = resp.json()
    for row in data["items"]:
        yield {cls}(id=str(row["id"]), title=row["title"], url=resp.url)
    if data.get("next"):
        yield ctx.follow(page=data["next"])
"""
)

TEST = '''"""Parser test for {task} ({kind} page): replays the answers recorded by
`{record}` (fixtures/{endpoint}/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from base_task import load_case, outputs_of, run_endpoint

CASE = Path(__file__).parent / "fixtures" / "{endpoint}"
RECORD = {record_repr}

pytestmark = pytest.mark.skipif(
    not (CASE / "case.json").exists(), reason=f"no recorded page yet: run {{RECORD}}"
)


def test_{endpoint}_parses_the_recorded_page(monkeypatch: pytest.MonkeyPatch) -> None:
    case = load_case(CASE)
    # the site's base URL as it was when the page was recorded ({env}), so fields built
    # from base_url() match; answers are matched by path and query, whatever the host
    for name, value in case.env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    items, follows = run_endpoint("{task}", case.params, case.fetcher())
{checks}
    assert outputs_of(items, follows) == case.outputs, (
        f"the parser's output changed since the page was recorded; if that is meant, record "
        f"it again: {{RECORD}}"
    )
'''

# Checks that hold whatever the endpoint's items become after a real edit (a link item with
# no title, other fields, another item type): the recorded outputs are the exact check.
CHECKS = {
    kind: (
        f'    assert items or follows, "{what} yields items or follow-ups"\n'
        "    for item in items:  # every item has its identity (its key fields are set)\n"
        '        assert all(getattr(item, k) not in (None, "") for k in item.key_fields), item\n'
        '    assert all(f.params != case.params for f in follows), "a follow-up changes a parameter"'
    )
    for kind, what in (("list", "a list page"), ("detail", "a detail page"), ("api", "an API page"))
}

TEMPLATES = {"list": LIST, "detail": DETAIL, "api": API}
SAMPLE_PARAMS = {"list": '{"page": 1}', "detail": '{"id": "1"}', "api": '{"page": 1}'}
SAMPLE_PATH = {"list": "/{endpoint}", "detail": "/{endpoint}/1", "api": "/api/{endpoint}"}


@dataclass
class Plan:
    """What `generate` writes, keeps, or appends to."""

    created: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)
    appended: list[tuple[Path, str]] = field(default_factory=list)  # (file, class name)
    record: str = ""  # the command that records the page the test replays
    test: Path | None = None


def _check(kind: str, name: str) -> str:
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise UserError(f"{kind} {name!r} must be a lower-case Python name (letters, digits, _)")
    return name


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def generate(
    site: str,
    platform: str,
    endpoint: str,
    root: Path = ROOT,
    *,
    kind: str = "list",
    item: str | None = None,
    base_url: str = "",
) -> Plan:
    """Write the files (module docstring); -> what was created, kept and appended to."""
    site, platform, endpoint = (
        _check("site", site),
        _check("platform", platform),
        _check("endpoint", endpoint),
    )
    item = _check("item", item or endpoint)
    if kind not in KINDS:
        raise UserError(f"--kind {kind!r}: expected one of {', '.join(KINDS)}")
    if base_url and not re.match(r"^https?://[^/\s]+", base_url):
        raise UserError(f"--base-url {base_url!r} must be an http:// or https:// URL")
    task = f"{site}.{platform}.{endpoint}"
    env = SITE_VARS["base_url"].name(site)
    record = f"./control.sh parse {task} '{SAMPLE_PARAMS[kind]}' --save-fixture"
    fmt = {
        "site": site,
        "platform": platform,
        "endpoint": endpoint,
        "camel": camel(endpoint),
        "cls": camel(item),
        "item": item,
        "env": env,
        "base_url": base_url.rstrip("/"),
        "task": task,
        "kind": kind,
        "record": record,
    }
    fmt["checks"] = CHECKS[kind]
    fmt["record_repr"] = repr(record)
    fmt["stdlib"] = "\nfrom urllib.parse import urljoin\n" if kind == "list" else ""
    pkg = root / "sites" / site
    module = pkg / platform / f"{endpoint}.py"
    test = fixture_dir(task, root / "tests").parent.parent / f"test_{endpoint}.py"
    clash = [p.relative_to(root) for p in (module, test) if p.exists()]
    if clash:
        raise UserError(
            f"{', '.join(map(str, clash))} exist(s) already; not overwriting "
            "(remove it, or choose another endpoint name)"
        )
    init = pkg / "__init__.py"
    if init.exists() and not re.search(r"^def base_url\(", init.read_text(), re.M):
        raise UserError(
            f"{init.relative_to(root)} exists without a base_url() function, which "
            f"the endpoint imports: add one (e.g. reading {env}) and run again"
        )
    items = pkg / "items.py"
    append = _item_class(items, fmt)
    plan = Plan(record=record, test=test)

    def write(path: Path, text: str) -> None:
        if path.exists():
            plan.kept.append(path)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_formatted(text))
        plan.created.append(path)

    write(init, SITE_INIT.format(**fmt))
    if append and items.exists():
        with items.open("a") as f:
            f.write(_formatted(ITEM_CLASS.format(**fmt), snippet=True))
        plan.appended.append((items, fmt["cls"]))
    elif not items.exists():
        write(items, ITEMS_HEAD.format(**fmt) + ITEM_CLASS.format(**fmt))
    else:
        plan.kept.append(items)
    write(pkg / platform / "__init__.py", PLATFORM_INIT.format(**fmt))
    write(module, TEMPLATES[kind].format(**fmt))
    for d in (test.parents[2], test.parents[1], test.parent):
        write(d / "__init__.py", "")
    write(test, TEST.format(**fmt))
    return plan


def _item_class(items: Path, fmt: dict[str, str]) -> bool:
    """Whether the item class must be added: False when `items.py` has it already."""
    if not items.exists():
        return True
    text = items.read_text()
    if re.search(rf"^class {fmt['cls']}\(", text, re.M):
        return False
    missing = [
        imp for imp in ("ClassVar", "Item") if not re.search(rf"\bimport\b.*\b{imp}\b", text)
    ]
    if missing:
        raise UserError(
            f"{items} does not import {' and '.join(missing)}, which the class "
            f"{fmt['cls']} needs: add the imports and run again"
        )
    return True


def _formatted(text: str, snippet: bool = False) -> str:
    """The text as the project's formatter writes it (lines wrap whatever the names' lengths);
    as it is where ruff is not installed."""
    ruff = ROOT / ".venv" / "bin" / "ruff"
    exe = str(ruff) if ruff.exists() else shutil.which("ruff")
    if not exe or not text.strip():
        return text
    out = subprocess.run(
        [exe, "format", "--stdin-filename", "generated.py", "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if out.returncode != 0:
        return text
    return "\n\n" + out.stdout if snippet else out.stdout


def _written_base_url(init: Path) -> str:
    """The default an earlier `new-site --base-url` wrote into the site's package, if any."""
    found = (
        re.search(r'^DEFAULT_BASE_URL = "([^"]*)"', init.read_text(), re.M)
        if init.exists()
        else None
    )
    return found.group(1) if found else ""


def run(
    site: str,
    platform: str,
    endpoint: str,
    *,
    kind: str = "list",
    item: str | None = None,
    base_url: str = "",
) -> int:
    """The command: generate, then say what was written and what to do next; -> 0."""
    plan = generate(site, platform, endpoint, kind=kind, item=item, base_url=base_url)
    for path in plan.created:
        print(f"created {path.relative_to(ROOT)}")
    for path, cls in plan.appended:
        print(f"added class {cls} to {path.relative_to(ROOT)}")
    for path in plan.kept:
        if path.name != "__init__.py" or path.parent.name == site:
            print(f"kept {path.relative_to(ROOT)} (exists)")
    env = SITE_VARS["base_url"].name(site)
    base_url = base_url.rstrip("/") or _written_base_url(ROOT / "sites" / site / "__init__.py")
    where = base_url or f"${env}"
    sample = SAMPLE_PATH[kind].format(endpoint=endpoint)
    test = plan.test.relative_to(ROOT) if plan.test else ""
    steps = [
        (f"./control.sh shell {where}{sample} --site {site}", "try selectors on the live page"),
        (f"edit sites/{site}/{platform}/{endpoint}.py until this prints the right items:", ""),
        (plan.record.removesuffix(" --save-fixture"), ""),
        (plan.record, "record the page"),
        (f"./control.sh test {test}", "replays it, offline"),
        ("./control.sh restart", "workers already running load it"),
    ]
    width = max(len(cmd) for cmd, note in steps if note) + 3
    print(f"\nthe site's base URL: {base_url or '(none yet)'}; {env} overrides it\nnext:")
    for cmd, note in steps:
        print(f"  {cmd.ljust(width)}{note}".rstrip())
    return 0


def main(a: argparse.Namespace) -> int:
    return run(a.site, a.platform, a.endpoint, kind=a.kind, item=a.item, base_url=a.base_url)
