"""`python -m bench.serve LEVEL serve ...`: `lifelong serve` with the root log level set.

The service logs one INFO line per applied event and has no log-level setting; a benchmark
run at WARNING measures the controller, not its log handler. Running the same figures at
INFO (`python -m bench --controller-log INFO`) shows what per-event logging costs.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

from service import cli
from service.cli import running
from service.logs import setup_logging


def main() -> int:
    chosen = logging.getLevelName(sys.argv[1].upper())
    if not isinstance(chosen, int):
        print(f"bench.serve: unknown log level {sys.argv[1]!r}", file=sys.stderr)
        return 2

    def setup_at_level(
        fmt: Literal["text", "json"], level: int = logging.INFO, stream: TextIO | None = None
    ) -> logging.Handler:
        """The service's own setup at the chosen level, whatever level it asks for."""
        return setup_logging(fmt, chosen, stream)

    # Replace the name `lifelong serve` sets logging up with; should that call move, the
    # replacement would go unused and the controllers would log at INFO unnoticed.
    if getattr(running, "setup_logging", None) is not setup_logging:
        print("bench.serve: `lifelong serve` no longer calls setup_logging", file=sys.stderr)
        return 2
    running.setup_logging = setup_at_level  # type: ignore[attr-defined]
    return cli.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
