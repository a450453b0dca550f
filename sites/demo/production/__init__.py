"""The demo platform's resources (demo/README.md, section 8): its rules in `profile`, the
cookie production chain in `cookies`, the device registration chain in `devices`.

Importing this package registers them all (endpoints on the `resources` queue, chains,
producers, ban rules, the signer, user agents, accounts); `sites.load_all()` does, so every
worker knows how to make the demo's cookies and devices.
"""

from __future__ import annotations

from sites.demo.production import cookies, devices, profile  # noqa: F401
