"""`lifelong`: the command line of the controller.

Failures print one clear line and exit non-zero, never a traceback. Exit codes: 0 success;
1 the command ran and found a problem; 2 bad usage or configuration; 3 a server the command
needs is unreachable.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from service.cli.connections import EXIT_INTERRUPTED, exit_code
from service.cli.parser import build_parser
from service.errors import ServiceError
from service.logs import escape_controls, redact

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `lifelong` command; its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ServiceError as e:
        print(f"lifelong: {escape_controls(redact(str(e)))}", file=sys.stderr)
        return exit_code(e)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
