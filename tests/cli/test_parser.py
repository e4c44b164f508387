"""The `lifelong` parser: bad arguments are usage errors, kinds have their aliases."""

from __future__ import annotations

import argparse

import pytest

from service import cli


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
