"""`lifelong apply` and `lifelong delete`: resources down to their edge nodes.

The operator talks to the controller the way Sedna's cloud does: resources go down the
node's downstream topic as insert/delete envelopes. Nothing changes state directly, so a
command can never bypass the lifecycle. Before sending, the target nodes must be served by
a live controller (see `service.cli.presence`), unless --force.
"""

from __future__ import annotations

import argparse
import queue
import sys
from collections.abc import Sequence

from service import wire
from service.adapters.mqtt import Inbound
from service.cli.arguments import (
    COMMON_NOTE,
    Subcommands,
    add_connection_flags,
    add_files_flag,
    add_namespace_flag,
    add_timeout_flag,
    kind_arg,
    name_arg,
    node_arg,
    subcommand,
)
from service.cli.checking import checked_documents
from service.cli.connections import (
    EXIT_OK,
    EXIT_PROBLEM,
    command_config,
    mqtt_session,
    publish_all,
)
from service.cli.envelopes import delete_envelope
from service.cli.presence import PRESENCE_WAIT_S, online_replicas, require_served
from service.config import Config
from service.errors import InvalidMessage

APPLY_EXAMPLES = (
    """examples:
  lifelong apply -f examples/dataset.yaml -f examples/lifelonglearningjob.yaml
  cat job.json | lifelong apply -f -
  lifelong apply -f all.yaml -n team-a       # namespace for documents that name none

Each Dataset goes to the node in its spec.nodeName, each LifelongLearningJob to the node in
spec.trainSpec.template.spec.nodeName, each JointInferenceService to its edge worker's node
(spec.edgeWorker.template.spec.nodeName), each FederatedLearningJob to every training
worker's node (spec.trainingWorkers[*].template.spec.nodeName), anything else (a Model) to
LIFELONG_NODE_NAME. Nothing is sent unless every document is valid and every node it goes
to is served by a live controller (--force sends anyway)."""
    + COMMON_NOTE
)

DELETE_EXAMPLES = (
    """examples:
  lifelong delete lifelonglearningjob atcii-classifier-demo
  lifelong delete dataset lifelong-dataset --node edge-node
  lifelong delete ji <name>                 # a joint-inference service (fl, model alike)

Nothing is sent unless the node is served by a live controller (--force sends anyway).
"""
    + COMMON_NOTE
)


def register(commands: Subcommands) -> None:
    """Add apply and delete."""
    apply = subcommand(commands, "apply", "send resources to their edge nodes", APPLY_EXAMPLES)
    add_files_flag(apply)
    add_namespace_flag(apply, "namespace of documents that name none (default: default)")
    add_timeout_flag(apply)
    _add_force_flag(apply)
    add_connection_flags(apply)
    apply.set_defaults(func=_apply)

    delete = subcommand(commands, "delete", "delete resources from an edge node", DELETE_EXAMPLES)
    delete.add_argument(
        "kind", type=kind_arg, metavar="KIND",
        help="dataset, lifelonglearningjob, model, jointinferenceservice (ji) or "
        "federatedlearningjob (fl)",
    )  # fmt: skip
    delete.add_argument("names", nargs="+", type=name_arg, metavar="NAME")
    add_namespace_flag(delete, "the resource's namespace (default: default)")
    delete.add_argument(
        "--node", type=node_arg, default=None, help="edge node (default: LIFELONG_NODE_NAME)"
    )
    add_timeout_flag(delete)
    _add_force_flag(delete)
    add_connection_flags(delete)
    delete.set_defaults(func=_delete)


def _add_force_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force", action="store_true",
        help="send even when no live controller serves the node (it reads the message when "
        "one starts)",
    )  # fmt: skip


def _apply(args: argparse.Namespace) -> int:
    cfg = command_config(args)
    checked = checked_documents(args.filename, args.namespace, cfg.node_name)
    lines = [line for c in checked for line in c.problem_lines()]
    for line in lines:
        print(line, file=sys.stderr)
    if lines:
        print(f"nothing sent: {len(lines)} problem(s)", file=sys.stderr)
        return EXIT_PROBLEM
    if not checked:
        raise InvalidMessage(f"no resources found in {', '.join(args.filename)}", "")
    outgoing = [
        (c.label, cfg.for_node(node).downstream_topic(), c.envelope)
        for c in checked
        for node in c.nodes or (cfg.node_name,)
    ]
    nodes = [node for c in checked for node in c.nodes or (cfg.node_name,)]
    _send(cfg, "apply", nodes, outgoing, args)
    return EXIT_OK


def _delete(args: argparse.Namespace) -> int:
    cfg = command_config(args)
    topic = cfg.for_node(args.node or cfg.node_name).downstream_topic()
    outgoing = []
    for name in args.names:
        envelope = delete_envelope(args.kind.wire, args.namespace, name)
        wire.decode_envelope(envelope)  # the controller's own header rules
        outgoing.append((f"delete of {args.kind.wire} {args.namespace}/{name}", topic, envelope))
    _send(cfg, "delete", [args.node or cfg.node_name], outgoing, args)
    return EXIT_OK


def _send(
    cfg: Config,
    verb: str,
    nodes: Sequence[str],
    outgoing: Sequence[tuple[str, str, bytes]],
    args: argparse.Namespace,
) -> None:
    """Publish to the nodes' downstream topics, once their presence says they are served."""
    presence: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
    subscriptions = [] if args.force else [cfg.presence_filter_all_nodes()]
    with mqtt_session(
        cfg, verb, args.timeout, subscriptions=subscriptions, inbound=presence
    ) as client:
        if not args.force:
            online = online_replicas(cfg, presence, nodes, PRESENCE_WAIT_S)
            require_served(cfg, nodes, online)
        publish_all(client, outgoing, args.timeout)
