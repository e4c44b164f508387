"""The commands that send resources to the edge, and the offline check of what they send:
`lifelong apply`, `lifelong delete`, `lifelong rollback` and `lifelong validate`.

`lifelong apply` and `lifelong delete`: resources down to their edge nodes.

The operator talks to the controller the way Sedna's cloud does: resources go down the
node's downstream topic as insert/delete envelopes. Nothing changes state directly, so a
command can never bypass the lifecycle. Before sending, the target nodes must be served by
a live controller (see `service.cli.connections`), unless --force.

`lifelong rollback job|ij NAME [--to-version V]`: put an earlier round's model back.

The command sends a `rollback` of the job on its node's downstream topic (content
`{"version": V}`, or none for the version deployed before the current one), the same durable
intake every downstream message goes through, and waits for the outcome the controller
publishes: a deploy `ready` upstream carrying `rollback` (exit 0, said on stdout), or a
record on the errors topic whose reason starts with `rollback of job <namespace>/<name>`
(exit 1, the reason on stderr). It subscribes to both before it sends, so the answer cannot
slip past.

`lifelong validate`: manifests checked offline, with the controller's own rules.
"""


import argparse
import contextlib
import json
import queue
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

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
    seconds_arg,
    subcommand,
)
from service.cli.connections import (
    EXIT_OK,
    EXIT_PROBLEM,
    PRESENCE_WAIT_S,
    command_config,
    mqtt_session,
    online_replicas,
    publish_all,
    require_served,
)
from service.cli.manifests import JOB_KINDS, Kind, checked_documents, delete_envelope
from service.cli.rendering import shown
from service.config import Config
from service.errors import InvalidMessage, PermanentError
from service.logs import redact

APPLY_EXAMPLES = (
    """examples:
  lifelong apply -f examples/dataset.yaml -f examples/lifelonglearningjob.yaml
  lifelong apply -f examples/models.yaml -f examples/incrementallearningjob.yaml
  cat job.json | lifelong apply -f -
  lifelong apply -f all.yaml -n team-a       # namespace for documents that name none

Each Dataset goes to the node in its spec.nodeName, each LifelongLearningJob to the node in
spec.trainSpec.template.spec.nodeName, each JointInferenceService to its edge worker's node
(spec.edgeWorker.template.spec.nodeName), each FederatedLearningJob to every training
worker's node (spec.trainingWorkers[*].template.spec.nodeName), anything else (a Model, an
IncrementalLearningJob: Sedna's GM sends it with its Models to its Dataset's node) to
LIFELONG_NODE_NAME. Nothing is sent unless every document is valid and every node it goes
to is served by a live controller (--force sends anyway)."""
    + COMMON_NOTE
)

DELETE_EXAMPLES = (
    """examples:
  lifelong delete lifelonglearningjob atcii-classifier-demo
  lifelong delete dataset lifelong-dataset --node edge-node
  lifelong delete ij helmet-detection-demo  # an incremental-learning job
  lifelong delete ji <name>                 # a joint-inference service (fl, model alike)

Nothing is sent unless the node is served by a live controller (--force sends anyway).
"""
    + COMMON_NOTE
)


def register_send(commands: Subcommands) -> None:
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
        help="dataset, lifelonglearningjob, incrementallearningjob (ij), model, "
        "jointinferenceservice (ji) or federatedlearningjob (fl)",
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
    with _sent(cfg, verb, nodes, outgoing, args):
        pass


@contextlib.contextmanager
def _sent(
    cfg: Config,
    verb: str,
    nodes: Sequence[str],
    outgoing: Sequence[tuple[str, str, bytes]],
    args: argparse.Namespace,
    *,
    answers: Sequence[str] = (),
) -> Iterator[queue.SimpleQueue[Inbound]]:
    """Publish to the nodes' downstream topics once their presence says they are served
    (unless --force), and, while the broker session lasts, give what arrives on `answers`
    (topics subscribed before anything is sent, so no answer can slip past)."""
    inbound: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
    presence = [] if args.force else [cfg.presence_filter_all_nodes()]
    with mqtt_session(
        cfg, verb, args.timeout, subscriptions=[*answers, *presence], inbound=inbound
    ) as client:
        if not args.force:
            online = online_replicas(cfg, inbound, nodes, PRESENCE_WAIT_S)
            require_served(cfg, nodes, online)
        publish_all(client, outgoing, args.timeout)
        yield inbound


DEFAULT_WAIT_S = 30.0

ROLLBACK_EXAMPLES = (
    """examples:
  lifelong rollback job atcii-classifier-demo                  # to the previous version
  lifelong rollback job atcii-classifier-demo --to-version 3 -n team-a
  lifelong rollback ij helmet-detection-demo                   # an incremental-learning job

The controller copies that round's model to <outputDir>/deploy/index.pkl (an
incremental-learning job's: to its deploy Model's url, and with hot update beside the
model config file, which it rewrites) whole or not at all, and says deploy ready upstream;
it refuses while the job's deploy copy is in flight, while another rollback copies, while
an eval compares its model with the deployed one, or when the model file is gone. Exit 1
with its reason, or when no answer came in --timeout.
Nothing is sent unless the node is served by a live controller (--force sends anyway)."""
    + COMMON_NOTE
)


def register_rollback(commands: Subcommands) -> None:
    """Add `lifelong rollback`."""
    parser = subcommand(
        commands, "rollback", "put an earlier round's model back in a job's deploy file",
        ROLLBACK_EXAMPLES,
    )  # fmt: skip
    parser.add_argument(
        "kind", type=_job_kind_arg, metavar="job|ij",
        help="job (a lifelong-learning job) or ij (an incremental-learning job)",
    )  # fmt: skip
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


def _job_kind_arg(text: str) -> Kind:
    """A job kind by any of its names; what `job` means stays a lifelong-learning job."""
    kind = kind_arg(text)
    if kind not in JOB_KINDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job kind: use job or ij")
    return kind


def _version_arg(text: str) -> int:
    try:
        version = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a round number") from None
    if version < 1:
        raise argparse.ArgumentTypeError("a round number is 1 or more")
    return version


def rollback_envelope(kind: Kind, namespace: str, name: str, version: int | None) -> bytes:
    """The downstream `rollback` of a job of `kind` (checked by the controller's own
    decoder)."""
    header = wire.Header(
        namespace=namespace, resource_kind=kind.wire, resource_name=name, operation="rollback"
    )
    content = None if version is None else {"version": version}
    envelope = wire.encode(wire.Envelope(header=header, content=content))
    wire.decode_envelope(envelope)
    return envelope


def _rollback(args: argparse.Namespace) -> int:
    cfg = command_config(args)
    node_cfg = cfg.for_node(args.node or cfg.node_name)
    envelope = rollback_envelope(args.kind, args.namespace, args.name, args.to_version)
    job = f"{args.namespace}/{args.name}"
    target = f"version {args.to_version}" if args.to_version else "the previous version"
    outgoing = [(f"rollback of job {job} to {target}", node_cfg.downstream_topic(), envelope)]
    answers = [node_cfg.upstream_topic_filter(), node_cfg.errors_topic()]
    with _sent(cfg, "rollback", [node_cfg.node_name], outgoing, args, answers=answers) as inbound:
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


VALIDATE_EXAMPLES = """examples:
  lifelong validate -f examples/lifelonglearningjob.yaml
  lifelong validate -f examples/models.yaml -f examples/incrementallearningjob.yaml
  kubectl get lifelonglearningjobs -o yaml | lifelong validate -f -

Checks offline, with the controller's own rules; prints one line per problem, naming the
field (like $.spec.dataset.trainProb), and exits 1 when there is any. A field of the spec the
controller does not know is a problem too (a misspelt one would silently take its default),
with the closest known name; worker templates stay free-form.
exit codes: 0 valid, 1 problems found, 2 file unreadable."""


def register_validate(commands: Subcommands) -> None:
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
