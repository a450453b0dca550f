"""`python -m demo ...`: run the demo platform in the foreground (see demo/README.md)."""

from __future__ import annotations

from demo.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
