"""The `lifelong` parser: bad arguments are usage errors, kinds have their aliases."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from service import cli
from service.cli import manifests

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_bad_arguments_are_usage_errors() -> None:
    parser = cli.build_parser()
    for argv in (["get", "pods"], ["delete", "job", "Bad_Name"], ["watch", "--count", "0"],
                 ["describe", "job", "x", "-n", "a.b"], ["apply"]):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 2, argv


def test_kind_aliases() -> None:
    parser = cli.build_parser()
    args: argparse.Namespace = parser.parse_args(["delete", "JOBS", "a", "b"])
    assert (args.kind.wire, args.names) == ("lifelonglearningjob", ["a", "b"])
    assert parser.parse_args(["get", "ds"]).kind.wire == "dataset"


def test_help_examples_name_the_shipped_examples() -> None:
    """Every `describe`/`delete` example names a resource examples/*.yaml defines."""
    shipped = {
        (doc["kind"].lower(), doc["metadata"]["name"])
        for path in EXAMPLES.glob("*.yaml")
        for doc in yaml.safe_load_all(path.read_text())
    }
    subcommands = next(
        a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    named = []
    for command in ("describe", "delete"):
        epilog = subcommands.choices[command].epilog or ""
        for kind, name in re.findall(rf"lifelong {command} (\w+) ([\w-]+)", epilog):
            named.append((manifests.kind_named(kind), name))
    assert len(named) >= 4, named
    for kind, name in named:
        assert kind is not None and (kind.wire, name) in shipped, (kind, name)
