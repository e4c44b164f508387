"""`lifelong rollback job NAME [--to-version V]`: put an earlier round's model back.

The command sends a `rollback` of the job on its node's downstream topic (content
`{"version": V}`, or none for the version deployed before the current one), the same durable
intake every downstream message goes through, and waits for the outcome the controller
publishes: a deploy `ready` upstream carrying `rollback` (exit 0, said on stdout), or a
record on the errors topic whose reason starts with `rollback of job <namespace>/<name>`
(exit 1, the reason on stderr). It subscribes to both before it sends, so the answer cannot
slip past.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time
from typing import Any

from service import wire
from service.adapters.mqtt import Inbound
from service.cli.arguments import (
    COMMON_NOTE,
    Subcommands,
    add_connection_flags,
    add_namespace_flag,
    name_arg,
    node_arg,
    seconds_arg,
    subcommand,
)
from service.cli.connections import (
    EXIT_OK,
    EXIT_PROBLEM,
    command_config,
    mqtt_session,
    publish_all,
)
from service.cli.kinds import JOB
from service.cli.presence import PRESENCE_WAIT_S, online_replicas, require_served
from service.cli.rendering import shown
from service.errors import PermanentError

DEFAULT_WAIT_S = 30.0

ROLLBACK_EXAMPLES = (
    """examples:
  lifelong rollback job atcii-classifier-demo                  # to the previous version
  lifelong rollback job atcii-classifier-demo --to-version 3 -n team-a

The controller copies that round's model to <outputDir>/deploy/index.pkl (whole or not at
all) and says deploy ready upstream; it refuses while the job's deploy copy is in flight,
while another rollback copies, while an eval compares its model with the deployed one, or
when the model file is gone. Exit 1 with its reason, or when no answer came in --timeout.
Nothing is sent unless the node is served by a live controller (--force sends anyway)."""
    + COMMON_NOTE
)


def register(commands: Subcommands) -> None:
    """Add `lifelong rollback`."""
    parser = subcommand(
        commands, "rollback", "put an earlier round's model back in a job's deploy file",
        ROLLBACK_EXAMPLES,
    )  # fmt: skip
    parser.add_argument("kind", choices=("job", JOB.wire), metavar="job")
    parser.add_argument("name", type=name_arg, metavar="NAME")
    parser.add_argument(
        "--to-version", type=_version_arg, default=None, metavar="V",
        help="the round whose model to restore (default: the previously deployed version)",
    )  # fmt: skip
    add_namespace_flag(parser, "the job's namespace (default: default)")
    parser.add_argument(
        "--node", type=node_arg, default=None, help="edge node (default: LIFELONG_NODE_NAME)"
    )
    parser.add_argument(
        "--timeout", type=seconds_arg, default=DEFAULT_WAIT_S, metavar="SECONDS",
        help=f"how long to wait for the controller's answer (default: {DEFAULT_WAIT_S:g})",
    )  # fmt: skip
    parser.add_argument(
        "--force", action="store_true",
        help="send even when no live controller serves the node (it reads the message when "
        "one starts; the command still waits --timeout for the answer)",
    )  # fmt: skip
    add_connection_flags(parser)
    parser.set_defaults(func=_rollback)


def _version_arg(text: str) -> int:
    try:
        version = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a round number") from None
    if version < 1:
        raise argparse.ArgumentTypeError("a round number is 1 or more")
    return version


def rollback_envelope(namespace: str, name: str, version: int | None) -> bytes:
    """The downstream `rollback` of a job (checked by the controller's own decoder)."""
    header = wire.Header(
        namespace=namespace, resource_kind=JOB.wire, resource_name=name, operation="rollback"
    )
    content = None if version is None else {"version": version}
    envelope = wire.encode(wire.Envelope(header=header, content=content))
    wire.decode_envelope(envelope)
    return envelope


def _rollback(args: argparse.Namespace) -> int:
    cfg = command_config(args)
    node_cfg = cfg.for_node(args.node or cfg.node_name)
    envelope = rollback_envelope(args.namespace, args.name, args.to_version)
    job = f"{args.namespace}/{args.name}"
    target = f"version {args.to_version}" if args.to_version else "the previous version"
    outgoing = [(f"rollback of job {job} to {target}", node_cfg.downstream_topic(), envelope)]
    inbound: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
    answers = [node_cfg.upstream_topic_filter(), node_cfg.errors_topic()]
    presence = [] if args.force else [cfg.presence_filter_all_nodes()]
    with mqtt_session(
        cfg, "rollback", args.timeout, subscriptions=answers + presence, inbound=inbound
    ) as client:
        if not args.force:
            online = online_replicas(cfg, inbound, [node_cfg.node_name], PRESENCE_WAIT_S)
            require_served(cfg, [node_cfg.node_name], online)
        publish_all(client, outgoing, args.timeout)
        answer = _answer(inbound, args, time.monotonic() + args.timeout)
    if answer is None:
        raise PermanentError(
            f"no answer to the rollback of job {job} within {args.timeout:g}s: is a controller "
            f"serving node {node_cfg.node_name}? (`lifelong watch` shows what it says)"
        )
    ok, text = answer
    print(shown([text]), file=sys.stdout if ok else sys.stderr, flush=True)
    return EXIT_OK if ok else EXIT_PROBLEM


def _answer(
    inbound: queue.SimpleQueue[Inbound], args: argparse.Namespace, deadline: float
) -> tuple[bool, str] | None:
    """The controller's answer to this rollback: (done, what it said); None at the deadline."""
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            msg = inbound.get(timeout=remaining)
        except queue.Empty:
            return None
        try:
            body = json.loads(msg.payload)
        except ValueError:
            continue
        if isinstance(body, dict):
            answer = answer_of(msg.topic, body, args.namespace, args.name, args.to_version)
            if answer is not None:
                return answer
    return None


def answer_of(
    topic: str, body: dict[str, Any], namespace: str, name: str, version: int | None
) -> tuple[bool, str] | None:
    """Whether an upstream or errors message answers a rollback of `namespace/name` (to
    `version`, None: any): (True, done) or (False, the refusal's reason); None if it does not."""
    job = f"{namespace}/{name}"
    if topic.endswith("/errors"):
        reason = body.get("reason")
        if isinstance(reason, str) and reason.startswith(f"rollback of job {job} "):
            return False, f"lifelong: {reason}"
        return None
    header, content = body.get("header"), body.get("content")
    if not isinstance(header, dict) or not isinstance(content, dict):
        return None
    if (header.get("namespace"), header.get("resourceName")) != (namespace, name):
        return None
    rolled = content.get("rollback")
    if content.get("phase") != "deploy" or content.get("status") != "ready":
        return None
    if not isinstance(rolled, dict) or version not in (None, rolled.get("toVersion")):
        return None
    return True, (
        f"job {job} rolled back from version {rolled.get('fromVersion')} to version "
        f"{rolled.get('toVersion')}"
    )
