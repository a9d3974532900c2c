"""Entry point for ``python -m statewright``."""

from statewright.cli import main

raise SystemExit(main())
