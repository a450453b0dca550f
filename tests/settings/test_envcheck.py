"""settings/envcheck.py and config's per-site variables: a misspelled CHAINCRAWL_* variable is
reported with the name it was meant to be, the names come from the settings classes, and no
module outside `config` reads a CHAINCRAWL_* variable itself (so the classes know them all)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from settings import envcheck
from settings.sitevars import SITE_VARS, site_env

ROOT = Path(__file__).resolve().parents[2]
SITES = ["demo", "shop"]
KINDS = {"kind": ("cookie", "device_id")}


def check(*names: str) -> list[str]:
    return envcheck.problems(SITES, {n: "x" for n in names}, KINDS)


def test_names_that_are_read_pass() -> None:
    assert (
        check(
            "CHAINCRAWL_MAX_RETRIES",  # Settings
            "CHAINCRAWL_REDIS_URL",
            "CHAINCRAWL_PROXY_MODE",  # ProxySettings
            "CHAINCRAWL_MONITOR_PORT",  # MonitorSettings
            "CHAINCRAWL_ALERTS_WEBHOOK",  # AlertSettings
            "CHAINCRAWL_JSONL_DIR",  # StorageSettings
            "CHAINCRAWL_SIGN_KEY_DEMO",  # per site
            "CHAINCRAWL_ACCOUNTS_SHOP",
            "CHAINCRAWL_UA_DEMO_H5",
            "CHAINCRAWL_CAPTCHA",
            "CHAINCRAWL_CAPTCHA_SHOP",
            "CHAINCRAWL_CAPTCHA_SERVICE_URL",
            "CHAINCRAWL_CAPTCHA_SERVICE_KEY_DEMO",
            "CHAINCRAWL_POOL_COOKIE",
            "CHAINCRAWL_POOL_DEVICE_ID_DEMO",
            "REDIS_URL",  # not ours to judge
            "PATH",
        )
        == []
    )


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("CHAINCRAWL_MAX_RETRYS", "is not a chaincrawl setting; did you mean CHAINCRAWL_MAX_RETRIES?"),
        ("CHAINCRAWL_PROXY_MOD", "is not a chaincrawl setting; did you mean CHAINCRAWL_PROXY_MODE?"),
        ("CHAINCRAWL_SIGN_KEY_DEMOO", ": no site 'demoo'; did you mean CHAINCRAWL_SIGN_KEY_DEMO?"),
        ("CHAINCRAWL_ACCOUNTS_SHOPS", ": no site 'shops'; did you mean CHAINCRAWL_ACCOUNTS_SHOP?"),
        ("CHAINCRAWL_UA_DEMO_TV", "is not a chaincrawl setting; did you mean CHAINCRAWL_UA_DEMO_PC?"),
        ("CHAINCRAWL_POOL_COOKI_SHOP", "is not a chaincrawl setting; did you mean CHAINCRAWL_POOL_COOKIE_SHOP?"),
        ("CHAINCRAWL_CAPTCHA_SERVCE_URL", "is not a chaincrawl setting; did you mean CHAINCRAWL_CAPTCHA_SERVICE_URL?"),
        ("CHAINCRAWL_SIGN_KEY_NEWSITE", ": no site 'newsite' (sites: demo, shop)"),
        ("CHAINCRAWL_POOL_DEVICE_ID_ELSEWHERE", ": no site 'elsewhere' (sites: demo, shop)"),
        ("CHAINCRAWL_WHATEVER", "is not a chaincrawl setting (README: Configuration)"),
    ],
)  # fmt: skip
def test_a_name_nothing_reads_is_reported(name: str, said: str) -> None:
    assert check(name, "CHAINCRAWL_MAX_RETRIES") == [name + ("" if said[0] == ":" else " ") + said]


def test_values_are_never_shown() -> None:
    out = envcheck.problems(SITES, {"CHAINCRAWL_SIGN_KEY_DEMOO": "hunter2-key"}, KINDS)
    assert out and "hunter2" not in " ".join(out)


def test_site_env_prefers_the_site_and_treats_empty_as_unset() -> None:
    env = {"CHAINCRAWL_CAPTCHA": "http", "CHAINCRAWL_CAPTCHA_DEMO": "ascii-5x7"}
    assert site_env("captcha", "demo", env) == "ascii-5x7"
    assert site_env("captcha", "shop", env) == "http"
    assert site_env("captcha", "demo", {**env, "CHAINCRAWL_CAPTCHA_DEMO": ""}) == "http"
    assert site_env("sign_key", "demo", env) is None  # no all-sites default for keys
    svc = {"CHAINCRAWL_CAPTCHA_SERVICE_URL_SHOP": "http://127.0.0.1:1"}
    assert site_env("captcha_service", "shop", svc, field="url") == "http://127.0.0.1:1"
    assert SITE_VARS["user_agents"].name("demo", family="app") == "CHAINCRAWL_UA_DEMO_APP"


# --- the catalogue stays true to the code ----------------------------------------------------

_NAME = re.compile(r"\bCHAINCRAWL_[A-Z0-9_]*[A-Z0-9]\b(?!_?[{<])")


def _literal_names(paths: list[Path]) -> dict[str, str]:
    """Complete CHAINCRAWL_* names written in these files (not prefixes or templates)."""
    out: dict[str, str] = {}
    for p in paths:
        text = p.read_text(errors="replace")
        # an example of the warning names a misspelling on purpose
        text = re.sub(r"\S+\s+(?:\S+\s+){0,3}\S*did you mean", "", text)
        for name in _NAME.findall(text):
            out.setdefault(name, str(p.relative_to(ROOT)))
    return out


def _sources() -> list[Path]:
    skip = {".venv", "var", ".git", "tests"}
    return [
        p
        for p in ROOT.rglob("*.py")
        if not skip & set(p.relative_to(ROOT).parts) and p.name != "envcheck.py"  # its examples
    ]


@pytest.mark.usefixtures("checkout_files")  # reads every file of the checkout
def test_every_name_the_code_or_readme_uses_is_known() -> None:
    """A variable read by code but missing from the catalogue would be reported as a typo."""
    files = [*_sources(), ROOT / "README.md", ROOT / "control.sh", *ROOT.glob("docs/*.md")]
    ok, _ = envcheck.site_patterns(["demo", "shop", "benchsite", "testsite"], None)
    fixed = envcheck.fixed_names()
    unknown = {
        n: where
        for n, where in _literal_names(files).items()
        if n not in fixed and not any(p.match(n) for p in ok)
    }
    assert unknown == {}


_READS = ("get", "getenv", "pop", "setdefault")


def _chaincrawl_name(node: ast.AST | None) -> str | None:
    """The CHAINCRAWL_* name a string or f-string starts with, else None."""
    if isinstance(node, ast.JoinedStr) and node.values:
        node = node.values[0]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if node.value.startswith("CHAINCRAWL_") else None
    return None


def _direct_reads(path: Path, root: Path = ROOT) -> list[str]:
    """`os.environ.get("CHAINCRAWL_X")`, `env["CHAINCRAWL_X"]`, `getenv(f"CHAINCRAWL_{x}")`,
    `"CHAINCRAWL_X" in os.environ`: each a read of a setting outside its settings class."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        name = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in _READS:
                name = _chaincrawl_name(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            name = _chaincrawl_name(node.slice)
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and "environ" in ast.unparse(node.comparators[0])
        ):
            name = _chaincrawl_name(node.left)
        if name:
            assert isinstance(node, ast.expr)  # a call, a subscript or a comparison
            found.append((node.lineno, name))
    return [f"{path.relative_to(root)}:{line}: {name}" for line, name in sorted(found)]


@pytest.mark.usefixtures("checkout_files")  # reads every file of the checkout
def test_no_module_outside_config_reads_a_chaincrawl_variable() -> None:
    """Every CHAINCRAWL_* setting is a field of a settings class in `config` (or a per-site
    family read through `config.site_env`), so the unknown-variable check and the reference
    know it; a module reading the environment itself would be invisible to both. Writing a
    child process's environment (`env["CHAINCRAWL_X"] = ...`) is not a read. Tests are left
    out: they set, save and restore variables around the processes they start (the variables
    only they read are `settings.suite.SuiteSettings`)."""
    skip = {".venv", "var", ".git", "config", "tests"}
    paths = [p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts)]
    assert [r for p in sorted(paths) for r in _direct_reads(p)] == []


def test_the_check_sees_a_direct_read(tmp_path: Path) -> None:
    """The scan above finds each way of reading a variable."""
    f = tmp_path / "probe.py"
    f.write_text(
        "import os\n"
        "a = os.environ.get('CHAINCRAWL_A', '')\n"
        "b = os.getenv(f'CHAINCRAWL_B_{a}')\n"
        "c = os.environ['CHAINCRAWL_C']\n"
        "d = 'CHAINCRAWL_D' in os.environ\n"
        "ok = 'CHAINCRAWL_F' in 'an error message'\n"
        "os.environ['CHAINCRAWL_E'] = 'written, not read'\n"
    )
    found = [r.rsplit(": ", 1)[1] for r in _direct_reads(f, tmp_path)]
    assert found == ["CHAINCRAWL_A", "CHAINCRAWL_B_", "CHAINCRAWL_C", "CHAINCRAWL_D"]
