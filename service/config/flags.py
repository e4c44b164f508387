"""The settings as command-line flags (`lifelong serve`, the worker, the demo) and as the
environment another process is given.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import cast

from service.config.controller import Config
from service.config.settings import HOSTNAME_VARIABLE, NODE_NAME, SETTINGS, lookup


class _Refused(argparse.Action):
    """The flag of a secret: refused with the ways to give it, never echoing the value."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        self.variable = str(kwargs.pop("variable"))
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            f"{option_string} is not taken: a flag shows in the process list; set "
            f"{self.variable}, or name a file holding it with {option_string}-file"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting; each defaults to None so an absent flag leaves env in charge.
    The flag of a secret is there only to be refused: else argparse would take it as an
    abbreviation of the `-file` flag beside it and echo the secret as a file name."""
    for setting in SETTINGS:
        if setting.secret:
            parser.add_argument(setting.flag, dest=setting.field, action=_Refused,
                                default=None, variable=setting.env)  # fmt: skip
            continue
        names = " / ".join((setting.env, *setting.fallbacks))
        parser.add_argument(
            setting.flag,
            dest=setting.field,
            default=None,
            metavar=setting.metavar,
            help=f"{setting.doc} (env {names}; default {setting.default_doc})",
        )


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Config:
    """Build a Config from parsed flags (added by `add_arguments`) over `environ`."""
    return Config.from_env(environ, _flag_values(args))


def _flag_values(args: argparse.Namespace) -> dict[str, str | None]:
    return {s.field: cast("str | None", getattr(args, s.field, None)) for s in SETTINGS}


def node_name_chosen(args: argparse.Namespace, environ: Mapping[str, str]) -> bool:
    """Whether someone chose the node name: its flag, LIFELONG_NODE_NAME or NODENAME. The
    host name and HOSTNAME (set in every container) are fallbacks, not choices."""
    raw, source = lookup(NODE_NAME, environ, _flag_values(args)["node_name"])
    return raw is not None and source != HOSTNAME_VARIABLE


def environment(cfg: Config, fields: Iterable[str]) -> dict[str, str]:
    """The variables that give another process these settings of `cfg`: {name: value}."""
    names = {s.field: s.env for s in SETTINGS}
    return {names[f]: str(getattr(cfg, f)) for f in fields}
