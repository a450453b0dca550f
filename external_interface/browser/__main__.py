"""`python -m external_interface.browser`: can this machine render? (check.py; exit 1 if not)."""

from __future__ import annotations

import sys

from external_interface.browser.check import main

sys.exit(main())
