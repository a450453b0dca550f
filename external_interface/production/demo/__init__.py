"""The demo platform's resources (demo/README.md, section 8): its rules in `profile`, the
cookie production chain in `cookies`, the device registration chain in `devices`."""

from __future__ import annotations

from external_interface.production.demo import cookies, devices, profile  # noqa: F401
