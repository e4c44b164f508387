"""`lifelong schemas`: regenerate (or check) the JSON Schemas and AsyncAPI document."""

from __future__ import annotations

import argparse

from service import schemas
from service.cli.arguments import Subcommands


def register(commands: Subcommands) -> None:
    """Add schemas."""
    schema = commands.add_parser(
        "schemas",
        help="generate schemas/ (JSON Schema + AsyncAPI) from the wire types",
        description="Write the JSON Schemas and AsyncAPI document; --check only compares.",
    )
    schema.add_argument("--check", action="store_true", help="exit 1 if schemas/ is stale")
    schema.add_argument("--out", default=None, help="output directory (default: schemas/)")
    schema.set_defaults(func=_schemas)


def _schemas(args: argparse.Namespace) -> int:
    extra = ["--check"] if args.check else []
    extra += ["--out", args.out] if args.out else []
    return schemas.main(extra)
