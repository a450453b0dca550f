"""`control.sh new-site SITE PLATFORM ENDPOINT`: an endpoint module, its schemas and a parser
test with a fixture placeholder, in the house style, so adding an endpoint takes minutes."""

from __future__ import annotations

import argparse
import keyword
import re
import shutil
import subprocess
from pathlib import Path

from cli import UserError
from config import ROOT

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

SITE_INIT = '''"""Site {site}: endpoints under sites/{site}/<platform>/."""

from __future__ import annotations

import os


def base_url() -> str:
    """Where the site lives; set {env} to point the crawl elsewhere."""
    return os.environ.get("{env}", "http://127.0.0.1:8080")
'''

PLATFORM_INIT = '''"""{site} {platform} endpoints."""
'''

ENDPOINT = '''"""{site} {platform}: {endpoint}. TODO: say in one line what this page is."""

from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from sites.{site} import base_url


class {camel}Params(Params):
    page: int = 1


class {camel}Item(Item):
    item_type: ClassVar[str] = "{site}.{endpoint}"
    key_fields: ClassVar[tuple[str, ...]] = ("id",)

    id: str
    title: str
    url: str


@endpoint({camel}Params, items=[{camel}Item])
def {endpoint}(ctx: Context, p: {camel}Params) -> Outputs:
    resp = ctx.get(f"{{base_url()}}/{endpoint}", params={{"page": p.page}})
    for row in resp.css("div.item"):
        yield {camel}Item(
            id=row.attrib.get("data-id", ""),
            title=row.css("a::text").get(default="").strip(),
            url=resp.url,
        )
    if resp.css("a.next"):
        yield ctx.follow(page=p.page + 1)
'''

TEST = '''"""Parser test for {site}.{platform}.{endpoint} against a saved page."""

from __future__ import annotations

from pathlib import Path

import pytest

from base_task import run_endpoint
from external_interface.mock import FixtureFetcher

FIXTURE = Path(__file__).parent / "fixtures" / "{endpoint}.html"


@pytest.mark.skipif(
    not FIXTURE.exists(), reason=f"no fixture yet: save a real page as {{FIXTURE}}"
)
def test_{endpoint}_parses_saved_page() -> None:
    items, follows = run_endpoint(
        "{site}.{platform}.{endpoint}", {{"page": 1}}, FixtureFetcher({{"^/": FIXTURE}})
    )
    assert items, "the saved page should yield at least one item"
    for item in items:
        assert item.id and item.title
    assert all(f.params["page"] == 2 for f in follows), "a next-page link leads to page 2"
'''


def _check(kind: str, name: str) -> str:
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise UserError(f"{kind} {name!r} must be a lower-case Python name (letters, digits, _)")
    return name


def generate(site: str, platform: str, endpoint: str, root: Path = ROOT) -> list[Path]:
    """Write the files; never overwrite an existing endpoint or test."""
    site, platform, endpoint = (
        _check("site", site), _check("platform", platform), _check("endpoint", endpoint)
    )  # fmt: skip
    camel = "".join(part.capitalize() for part in endpoint.split("_"))
    fmt = {"site": site, "platform": platform, "endpoint": endpoint, "camel": camel,
           "env": f"{site.upper()}_BASE_URL"}  # fmt: skip
    module = root / "sites" / site / platform / f"{endpoint}.py"
    test = root / "tests" / "sites" / site / platform / f"test_{endpoint}.py"
    for path in (module, test):
        if path.exists():
            raise UserError(f"{path.relative_to(root)} exists already; not overwriting it")
    written: list[Path] = []

    def write(path: Path, text: str) -> None:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)

    write(root / "sites" / site / "__init__.py", SITE_INIT.format(**fmt))
    write(root / "sites" / site / platform / "__init__.py", PLATFORM_INIT.format(**fmt))
    write(module, ENDPOINT.format(**fmt))
    for d in (test.parents[2], test.parents[1], test.parent):
        write(d / "__init__.py", "")
    (test.parent / "fixtures").mkdir(exist_ok=True)
    write(test, TEST.format(**fmt))
    _format(written)
    return written


def _format(paths: list[Path]) -> None:
    """Wrap lines the way the project's formatter would, whatever the names' lengths."""
    ruff = ROOT / ".venv" / "bin" / "ruff"
    exe = str(ruff) if ruff.exists() else shutil.which("ruff")
    if exe and paths:
        subprocess.run([exe, "format", "-q", *map(str, paths)], cwd=ROOT, check=False)


def cmd_new_site(a: argparse.Namespace) -> None:
    files = generate(a.site, a.platform, a.endpoint)
    for f in files:
        print(f"created {f.relative_to(ROOT)}")
    fixture = Path("tests/sites") / a.site / a.platform / "fixtures" / f"{a.endpoint}.html"
    print(
        f"next: edit the selectors, save a real page as {fixture}, run ./control.sh test {fixture.parent.parent}"
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("new-site", help="generate an endpoint module, schemas and a parser test")
    p.add_argument("site")
    p.add_argument("platform", help="e.g. pc, h5, app, common")
    p.add_argument("endpoint", help="e.g. user_info")
    p.set_defaults(fn=cmd_new_site)
