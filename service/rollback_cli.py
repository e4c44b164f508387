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

from service import messages, ops
from service.adapters.mqtt import Inbound, MqttClient
from service.errors import BrokerUnavailable, PermanentError

DEFAULT_WAIT_S = 30.0
JOB_WIRE_KIND = "lifelonglearningjob"

ROLLBACK_EXAMPLES = (
    """examples:
  lifelong rollback job atcii-classifier-demo                  # to the previous version
  lifelong rollback job atcii-classifier-demo --to-version 3 -n team-a

The controller copies that round's model to <outputDir>/deploy/index.pkl (whole or not at
all) and says deploy ready upstream; it refuses while the job's deploy copy is in flight,
while another rollback copies, while an eval compares its model with the deployed one, or
when the model file is gone. Exit 1 with its reason, or when no answer came in --timeout."""
    + ops._COMMON_NOTE
)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `lifelong rollback`."""
    parser = ops._parser(
        commands, "rollback", "put an earlier round's model back in a job's deploy file",
        ROLLBACK_EXAMPLES,
    )  # fmt: skip
    parser.add_argument("kind", choices=("job", JOB_WIRE_KIND), metavar="job")
    parser.add_argument("name", type=ops._name_arg, metavar="NAME")
    parser.add_argument(
        "--to-version", type=_version_arg, default=None, metavar="V",
        help="the round whose model to restore (default: the previously deployed version)",
    )  # fmt: skip
    parser.add_argument(
        "-n", "--namespace", type=ops._namespace_arg, default=ops.DEFAULT_NAMESPACE,
        help="the job's namespace (default: default)",
    )  # fmt: skip
    parser.add_argument(
        "--node", type=ops._node_arg, default=None, help="edge node (default: LIFELONG_NODE_NAME)"
    )
    parser.add_argument(
        "--timeout", type=ops._seconds_arg, default=DEFAULT_WAIT_S, metavar="SECONDS",
        help=f"how long to wait for the controller's answer (default: {DEFAULT_WAIT_S:g})",
    )  # fmt: skip
    ops._add_connection_flags(parser)
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
    header = messages.Header(
        namespace=namespace, resource_kind=JOB_WIRE_KIND, resource_name=name,
        operation="rollback",
    )  # fmt: skip
    content = None if version is None else {"version": version}
    envelope = messages.encode(messages.Envelope(header=header, content=content))
    messages.decode_envelope(envelope)
    return envelope


def _rollback(args: argparse.Namespace) -> int:
    cfg = ops._config(args)
    node = args.node or cfg.node_name
    topics = [
        ops.upstream_filter(cfg.upstream_topic, cfg.topic_prefix, node),
        f"{cfg.topic_prefix}/{node}/errors",
    ]
    envelope = rollback_envelope(args.namespace, args.name, args.to_version)
    job = f"{args.namespace}/{args.name}"
    inbound: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
    with ops._mqtt(cfg, "rollback", args.timeout, subscriptions=topics, inbound=inbound) as c:
        _wait_subscribed(c, args.timeout)
        target = f"version {args.to_version}" if args.to_version else "the previous version"
        outgoing = [(f"rollback of job {job} to {target}", ops.downstream_topic(
            cfg.topic_prefix, node), envelope)]  # fmt: skip
        ops._publish_all(c, outgoing, args.timeout)
        answer = _answer(inbound, args, time.monotonic() + args.timeout)
    if answer is None:
        raise PermanentError(
            f"no answer to the rollback of job {job} within {args.timeout:g}s: is a controller "
            f"serving node {node}? (`lifelong watch` shows what it says)"
        )
    ok, text = answer
    print(text, file=sys.stdout if ok else sys.stderr, flush=True)
    return ops.EXIT_OK if ok else ops.EXIT_PROBLEM


def _wait_subscribed(client: MqttClient, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not client.subscribed:
        if time.monotonic() > deadline:
            what = f"the broker did not confirm the subscriptions within {timeout_s:g}s"
            raise BrokerUnavailable(what)
        time.sleep(0.02)


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
