"""The commands that show what the controllers did: `lifelong get` and `lifelong describe` (what
they wrote to Redis) and `lifelong watch` (what they publish, as it happens).

`lifelong get` and `lifelong describe`: what the controllers wrote to Redis, as tables and
detailed views (read only), for every kind: lifelong-learning and incremental-learning jobs,
datasets, models, joint-inference services and federated-learning jobs. The two job kinds
share one store kind (and one namespace/name space): each lists and describes its own jobs.

`lifelong watch`: upstream status and rejections as they happen.
"""


import argparse
import json
import queue
import re
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import msgspec

from service import wire
from service.adapters.mqtt import Inbound
from service.adapters.redis_store import RedisStore
from service.cli.arguments import (
    COMMON_NOTE,
    DEFAULT_TIMEOUT_S,
    Subcommands,
    add_connection_flags,
    add_namespace_flag,
    count_arg,
    kind_arg,
    name_arg,
    namespace_arg,
    node_arg,
    seconds_arg,
    subcommand,
)
from service.cli.connections import (
    EXIT_OK,
    EXIT_PROBLEM,
    command_config,
    mqtt_session,
    store_session,
)
from service.cli.manifests import DATASET, JOB_KINDS, Kind
from service.cli.rendering import (
    dataset_row,
    describe_dataset,
    describe_job,
    describe_json,
    describe_lines,
    describe_resource,
    get_columns,
    gm_link_line,
    history_lines,
    job_row,
    render,
    resource_row,
    shown,
    watch_line,
)
from service.core.rounds import decode_rounds
from service.core.state import DatasetState, JobState, ResourceState, State, decode_state
from service.errors import InvalidMessage, PermanentError
from service.history import decode_records, last_change_ms
from service.keys import JOB_KIND, parse_rkey, rkey
from service.logs import redact
from service.runtime.intake import GmLinkRecord
from service.urls import redact_url

HISTORY_FOR_AGE = 100
DEFAULT_HISTORY = 20

GET_EXAMPLES = (
    """examples:
  lifelong get jobs
  lifelong get datasets -n default
  lifelong get jobs -o json | jq '.[].phase'
  lifelong get ij          # incremental-learning jobs (get jobs: lifelong-learning ones)
  lifelong get models
  lifelong get ji          # joint-inference services: the reports of their workers forwarded
  lifelong get fl          # federated-learning jobs, the same

STATE is the job's step (waiting, preparing, running, copying, staged: due, waiting for
Sedna's GM to show the stage Waiting), or no-dataset when its dataset is unknown, binding on
a node that only forwards the reports of a GM-managed job's workers (its dataset lives on
another node), paused when its dataset was deleted, backoff while it waits to retry after
failed rounds (describe says until when). A dataset's STATUS is ok once read, unreadable while
its source cannot be read (describe says why). DEPLOYED is the round whose model a job's
deploy file holds, METRIC its main metric (the deploy condition's, else the first reported)
as measured in that round."""
    + COMMON_NOTE
)

DESCRIBE_EXAMPLES = (
    """examples:
  lifelong describe job atcii-classifier-demo
  lifelong describe job atcii-classifier-demo -o json | jq '.rounds[-1]'
  lifelong describe dataset lifelong-dataset --history 50
  lifelong describe ij helmet-detection-demo  # an incremental-learning job
  lifelong describe model <name>            # ji and fl alike

A job shows its deploy gate, the deployed model (and the versions a rollback can restore)
and its last 50 rounds (times, sample counts, the metrics of the new and of the deployed
model, why a round was not deployed) under a sparkline of the main metric. A model shows
its url, format, devices and whether it names a credential; a joint-inference service or a
federated-learning job its workers (models, datasets, nodes, images) and the reports of its
workers forwarded upstream. An incremental-learning job also shows its Models (initial, eval,
deploy: url, format, devices once the round that needs each looked it up), its hot update
and where a deployed model goes (the deploy Model's url).
"""
    + COMMON_NOTE
)

T = TypeVar("T")


def register_status(commands: Subcommands) -> None:
    """Add get and describe."""
    get = subcommand(
        commands, "get", "list jobs, ij, datasets, models, ji or fl with their progress",
        GET_EXAMPLES,
    )  # fmt: skip
    get.add_argument("kind", type=kind_arg, metavar="jobs|ij|datasets|models|ji|fl")
    get.add_argument(
        "-n", "--namespace", type=namespace_arg, default=None,
        help="only this namespace (default: all)",
    )  # fmt: skip
    get.add_argument("-o", "--output", choices=("table", "json"), default="table")
    add_connection_flags(get)
    get.set_defaults(func=_get)

    describe = subcommand(
        commands, "describe",
        "show one job, ij, dataset, model, ji or fl in detail, with its history",
        DESCRIBE_EXAMPLES,
    )  # fmt: skip
    describe.add_argument("kind", type=kind_arg, metavar="job|ij|dataset|model|ji|fl")
    describe.add_argument("name", type=name_arg, metavar="NAME")
    add_namespace_flag(describe, "the resource's namespace (default: default)")
    describe.add_argument(
        "--history", type=count_arg, default=DEFAULT_HISTORY, metavar="N",
        help=f"history events to show (default: {DEFAULT_HISTORY}, at most 100)",
    )  # fmt: skip
    describe.add_argument(
        "-o", "--output", choices=("text", "json"), default="text",
        help="json: a job's deploys and rounds as data (datasets: text only)",
    )  # fmt: skip
    add_connection_flags(describe)
    describe.set_defaults(func=_describe)


def _get(args: argparse.Namespace) -> int:
    cfg = command_config(args)
    with store_session(cfg) as store:
        keys = [
            k for k in store.states.list_rkeys(args.kind.store) if _in_namespace(k, args.namespace)
        ]
        raw_states = store.states.load(keys)
        changed = {
            k: last_change_ms(decode_records(store.states.history(k, HISTORY_FOR_AGE)))
            for k in keys
        }
        link = _gm_link(store)
    now_ms = time.time_ns() // 1_000_000
    rows = []
    for key, raw in raw_states.items():
        state = None if raw is None else _state_or_none(key, raw)
        if state is not None and _other_job_kind(state, args.kind) is not None:
            continue
        if isinstance(state, JobState):
            rows.append({**job_row(state, changed[key], now_ms), **get_columns(state)})
        elif isinstance(state, DatasetState):
            rows.append(dataset_row(state, changed[key], now_ms))
        elif isinstance(state, ResourceState):
            rows.append(resource_row(state, changed[key], now_ms))
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    elif not rows:
        # name the Redis read: the defaults may point at another one than the controller's
        where = f" in namespace {args.namespace}" if args.namespace else ""
        redis = redact_url(cfg.redis_url)
        print(f"No {args.kind.wire} resources found{where} in {redis}.", file=sys.stderr)
    else:
        print(render(list(rows[0]), [list(row.values()) for row in rows]))
    if args.output != "json" and link is not None:
        # on stderr, so the table stays the only thing a pipe reads
        print(shown([gm_link_line(link, now_ms)]), file=sys.stderr)
    return EXIT_OK


def _gm_link(store: RedisStore) -> GmLinkRecord | None:
    """The GM link as its holder last recorded it; None when none is recorded or readable."""
    raw = store.leases.gm_link()
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=GmLinkRecord)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _state_or_none(resource_key: str, raw: bytes) -> State | None:
    """A stored state, or None (said on stderr) when it cannot be read: one bad record must
    not hide the others."""
    try:
        return decode_state(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        skipped = f"lifelong: skipped {resource_key}: its stored state is unreadable"
        print(shown([skipped]), file=sys.stderr)
        return None


def _other_job_kind(state: State, kind: Kind) -> Kind | None:
    """The kind of a job stored under the same store kind as `kind` but not of it (the two
    job kinds share one); None when the state is of `kind`."""
    if not isinstance(state, JobState) or state.spec.kind == kind.wire:
        return None
    return next(k for k in JOB_KINDS if k.wire == state.spec.kind)


def _in_namespace(resource_key: str, namespace: str | None) -> bool:
    if namespace is None:
        return True
    try:
        return parse_rkey(resource_key).namespace == namespace
    except ValueError:
        return False


def _describe(args: argparse.Namespace) -> int:
    cfg = command_config(args)
    key = rkey(args.kind.store, args.namespace, args.name)
    with store_session(cfg) as store:
        raw = store.states.load([key]).get(key)
        if raw is None:
            raise PermanentError(f"{args.kind.wire} {args.namespace}/{args.name} not found")
        resource = store.states.load_resource(key)
        records = decode_records(store.states.history(key, max(args.history, HISTORY_FOR_AGE)))
        users = store.records.dataset_jobs(key) if args.kind is DATASET else []
        rounds = decode_rounds(store.states.rounds(key)) if args.kind.store == JOB_KIND else []
        link = _gm_link(store)
    state = _state_or_none(key, raw)
    if state is None:
        return EXIT_PROBLEM
    other = _other_job_kind(state, args.kind)
    if other is not None:
        spoken = _spoken(other)
        article = "an" if spoken[0] in "aeiou" else "a"
        raise PermanentError(
            f"{args.kind.wire} {args.namespace}/{args.name} not found: it is {article} "
            f"{spoken} (lifelong describe {other.short} {args.name})"
        )
    if args.output == "json" and isinstance(state, JobState):
        print(redact(json.dumps(describe_json(state, rounds), indent=2)))
        return EXIT_OK
    now_ms = time.time_ns() // 1_000_000
    if isinstance(state, JobState):
        lines = describe_job(state, _learning_job(resource), records, now_ms)
        lines += describe_lines(state, rounds)
    elif isinstance(state, ResourceState):
        lines = describe_resource(state, _decoded(resource, wire.decode_stored), records, now_ms)
    else:
        lines = describe_dataset(state, users, records, now_ms)
    lines.append(gm_link_line(link, now_ms))
    lines += history_lines(records[-args.history :], now_ms)
    print(shown(lines))
    return EXIT_OK


def _spoken(kind: Kind) -> str:
    """A job kind in words: `lifelong-learning job` for `LifelongLearningJob`."""
    *words, last = re.findall(r"[A-Z][a-z]*", kind.title)
    return f"{'-'.join(words)} {last}".lower()


def _learning_job(raw: bytes | None) -> wire.LearningJob | None:
    """The stored job resource of either kind; None when there is none or it does not
    decode."""
    job = _decoded(raw, wire.decode_resource)
    return job if isinstance(job, wire.LifelongLearningJob | wire.IncrementalLearningJob) else None


def _decoded(raw: bytes | None, decode: Callable[[bytes], T]) -> T | None:
    """The stored resource, decoded; None when there is none or it does not decode."""
    if raw is None:
        return None
    try:
        return decode(raw)
    except InvalidMessage:
        return None


WATCH_EXAMPLES = (
    """examples:
  lifelong watch                         # until Ctrl-C
  lifelong watch --count 3 --timeout 30  # stop after 3 messages or 30 s
  lifelong watch -o json | jq .

With --count, exit 1 when fewer messages arrived before the timeout."""
    + COMMON_NOTE
)


def register_watch(commands: Subcommands) -> None:
    """Add watch."""
    watch = subcommand(
        commands, "watch", "print upstream status and rejections as they happen", WATCH_EXAMPLES
    )
    watch.add_argument("--count", type=count_arg, default=None, metavar="N",
                       help="stop after N messages")  # fmt: skip
    watch.add_argument("--timeout", type=seconds_arg, default=None, metavar="SECONDS",
                       help="stop after this long")  # fmt: skip
    watch.add_argument("--node", type=node_arg, default=None,
                       help="edge node (default: LIFELONG_NODE_NAME)")  # fmt: skip
    watch.add_argument("-o", "--output", choices=("text", "json"), default="text")
    add_connection_flags(watch)
    watch.set_defaults(func=_watch)


def _watch(args: argparse.Namespace) -> int:
    cfg = command_config(args)
    node_cfg = cfg.for_node(args.node or cfg.node_name)
    topics = [node_cfg.upstream_topic_filter(), node_cfg.errors_topic()]
    inbound: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
    connect_s = args.timeout or DEFAULT_TIMEOUT_S
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    seen = 0
    with mqtt_session(cfg, "watch", connect_s, subscriptions=topics, inbound=inbound):
        print(f"watching {' and '.join(topics)}", file=sys.stderr, flush=True)
        while args.count is None or seen < args.count:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            try:
                msg = inbound.get(timeout=remaining)
            except queue.Empty:
                break
            seen += 1
            print(watch_line(msg.topic, msg.payload, msg.received_at, args.output), flush=True)
    if args.count is not None and seen < args.count:
        print(f"watch: {seen} of {args.count} messages before the timeout", file=sys.stderr)
        return EXIT_PROBLEM
    return EXIT_OK
