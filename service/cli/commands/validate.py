"""`lifelong validate`: manifests checked offline, with the controller's own rules."""

from __future__ import annotations

import argparse
import sys

from service.cli.arguments import Subcommands, add_files_flag, add_namespace_flag, subcommand
from service.cli.checking import checked_documents
from service.cli.connections import EXIT_OK, EXIT_PROBLEM
from service.errors import InvalidMessage
from service.logs import redact

VALIDATE_EXAMPLES = """examples:
  lifelong validate -f examples/lifelonglearningjob.yaml
  kubectl get lifelonglearningjobs -o yaml | lifelong validate -f -

Checks offline, with the controller's own rules; prints one line per problem, naming the
field (like $.spec.dataset.trainProb), and exits 1 when there is any. A field of the spec the
controller does not know is a problem too (a misspelt one would silently take its default),
with the closest known name; worker templates stay free-form.
exit codes: 0 valid, 1 problems found, 2 file unreadable."""


def register(commands: Subcommands) -> None:
    """Add validate."""
    validate = subcommand(
        commands, "validate", "check resource files offline, naming each bad field",
        VALIDATE_EXAMPLES,
    )  # fmt: skip
    add_files_flag(validate)
    add_namespace_flag(validate, "namespace of documents that name none (default: default)")
    validate.set_defaults(func=_validate)


def _validate(args: argparse.Namespace) -> int:
    try:
        checked = checked_documents(args.filename, args.namespace, None)
    except InvalidMessage as e:
        print(redact(str(e)), flush=True)
        return EXIT_PROBLEM
    lines = [line for c in checked for line in c.problem_lines()]
    for line in lines:
        print(line)
    if not checked:
        print(f"{', '.join(args.filename)}: no resources found")
        return EXIT_PROBLEM
    if lines:
        print(f"{len(lines)} problem(s) in {len(checked)} resource(s)", file=sys.stderr)
        return EXIT_PROBLEM
    for c in checked:
        routed = f", for node {', '.join(c.nodes)}" if c.nodes else ""
        print(f"{c.where}: {c.kind_title} {c.namespace}/{c.name} is valid{routed}")
    return EXIT_OK
