"""Is a browser installed? Which Chromium to run, and what to install when there is none.

Rendering needs two things the base install leaves out: a Chromium from the system's package
manager (nothing downloads browser builds at run time) and the `browser` extra (Playwright),
installed by `./control.sh setup --browser`. `problems()` says exactly what is missing;
`python -m external_interface.browser` prints it (control.sh runs it after setup) and
exits with 1 when rendering cannot work. Playwright is found without being imported, so this
check costs a worker nothing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys

from settings.browser import BrowserSettings, get_browser_settings

# Debian's chromium package installs the browser as /usr/lib/chromium/chromium behind a shell
# script, /usr/bin/chromium, that adds switches of its own (extension loading, GPU raster) and
# Google API keys; the binary itself renders a page with ~10 % less CPU (bench/render_bench.py).
CANDIDATES = (
    "/usr/lib/chromium/chromium",
    "chromium",
    "chromium-browser",
    "google-chrome-stable",
    "google-chrome",
)
INSTALL_CHROMIUM = (
    "no Chromium found: install it with `apt-get install chromium` (Debian/Ubuntu; "
    "`dnf install chromium` on Fedora), or point CHAINCRAWL_BROWSER_EXECUTABLE at a "
    "Chrome/Chromium binary"
)
INSTALL_PLAYWRIGHT = (
    "Playwright (the `browser` extra) is not installed: run `./control.sh setup --browser` "
    "(or `pip install playwright`; never `playwright install`, the system Chromium is used)"
)


def find_executable(configured: str = "") -> str | None:
    """The Chromium to run: `configured` (a path or a name on PATH) when given, else the
    first of `CANDIDATES` found."""
    for name in (configured,) if configured else CANDIDATES:
        path = name if os.sep in name else shutil.which(name)
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def playwright_installed() -> bool:
    return importlib.util.find_spec("playwright") is not None


def problems(executable: str | None = None) -> list[str]:
    """What keeps this machine from rendering pages, each with the command that fixes it.
    `executable`: the configured Chromium (default: CHAINCRAWL_BROWSER_EXECUTABLE)."""
    configured = get_browser_settings().executable if executable is None else executable
    out = []
    if find_executable(configured) is None:
        if configured:
            out.append(
                f"the browser {configured!r} (CHAINCRAWL_BROWSER_EXECUTABLE) is not an "
                "executable file; " + INSTALL_CHROMIUM.split(": ", 1)[1]
            )
        else:
            out.append(INSTALL_CHROMIUM)
    if not playwright_installed():
        out.append(INSTALL_PLAYWRIGHT)
    return out


def describe(settings: BrowserSettings | None = None) -> str:
    """One line naming the browser and driver that would run (for `check` and the bench)."""
    s = settings or get_browser_settings()
    exe = find_executable(s.executable) or "?"
    try:
        version = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        version = "?"
    pw = importlib.metadata.version("playwright") if playwright_installed() else "missing"
    return f"{version or exe} ({exe}), playwright {pw}"


def main() -> int:
    found = problems()
    if found:
        for line in found:
            print(f"browser: {line}", file=sys.stderr)
        return 1
    print(f"browser: ok: {describe()}")
    return 0
