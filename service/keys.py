"""Every Redis key name the service uses, in one module.

Per-shard keys carry the hash tag ``{s<N>}`` so that each Lua script touches one hash slot
(Redis Cluster compatible). A resource's keys (state, resource JSON, histories) live in the
shard of its resource key (``rkey``), so a commit for one resource never leaves its slot.
The ingress lease, its fence and its holder's "subscribed" marker share the tag
``{ingress}`` (one script takes lease and fence, one MGET lease and marker). The
other global keys (live replicas, dead letters, a dataset's jobs, the GM link's state)
carry no tag: each is only ever used alone, one key per command or transaction, so its
slot is its own.
"""


import hashlib
import zlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal, NamedTuple

NUM_SHARDS = 16
DEFAULT_PREFIX = "lifelong"

#: The kinds of resource, as resource keys spell them: lifelong-learning jobs and datasets,
#: which the controller runs, and the kinds it only stores (`StoredKind`).
Kind = Literal["job", "dataset", "model", "jointinference", "federatedlearning"]
StoredKind = Literal["model", "jointinference", "federatedlearning"]
JOB_KIND: Kind = "job"
DATASET_KIND: Kind = "dataset"
MODEL_KIND: StoredKind = "model"
JOINT_INFERENCE_KIND: StoredKind = "jointinference"
FEDERATED_LEARNING_KIND: StoredKind = "federatedlearning"
#: The `resourceKind` of each kind on the wire (envelope headers, a report's `ownerKind`).
WIRE_KINDS: Mapping[Kind, str] = MappingProxyType(
    {
        JOB_KIND: "lifelonglearningjob",
        DATASET_KIND: "dataset",
        MODEL_KIND: "model",
        JOINT_INFERENCE_KIND: "jointinferenceservice",
        FEDERATED_LEARNING_KIND: "federatedlearningjob",
    }
)
#: The stored kinds by their wire name.
STORED_KINDS: Mapping[str, StoredKind] = MappingProxyType(
    {
        WIRE_KINDS[MODEL_KIND]: MODEL_KIND,
        WIRE_KINDS[JOINT_INFERENCE_KIND]: JOINT_INFERENCE_KIND,
        WIRE_KINDS[FEDERATED_LEARNING_KIND]: FEDERATED_LEARNING_KIND,
    }
)
# The ingress streams' consumer group and its one consumer: shard leases already guarantee a
# single reader, and a fixed consumer name lets the next owner read its predecessor's
# un-acknowledged entries with id "0".
INGRESS_GROUP = "lifelong"
INGRESS_CONSUMER = "owner"


class ResourceKey(NamedTuple):
    """A resource of one of the kinds; ``<kind>:<namespace>/<name>`` names it in Redis."""

    kind: Kind
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.namespace}/{self.name}"

    @property
    def path(self) -> str:
        """``<namespace>/<name>``, as logs and the CLI show it."""
        return f"{self.namespace}/{self.name}"

    @property
    def wire_kind(self) -> str:
        return WIRE_KINDS[self.kind]


def rkey(kind: str, namespace: str, name: str) -> str:
    """The resource key ``<kind>:<namespace>/<name>`` (kind one of `Kind`)."""
    if kind not in WIRE_KINDS:
        raise ValueError(f"unknown resource kind {kind!r}")
    return f"{kind}:{namespace}/{name}"


def job_key(namespace: str, name: str) -> str:
    return f"{JOB_KIND}:{namespace}/{name}"


def dataset_key(namespace: str, name: str) -> str:
    return f"{DATASET_KIND}:{namespace}/{name}"


def parse_rkey(text: str) -> ResourceKey:
    """The parts of a resource key; ValueError when ``text`` is not one."""
    kind, colon, path = text.partition(":")
    namespace, slash, name = path.partition("/")
    if not colon or not slash or not namespace or not name:
        raise ValueError(f"not a resource key: {text!r}")
    for known in WIRE_KINDS:
        if kind == known:
            return ResourceKey(known, namespace, name)
    raise ValueError(f"unknown resource kind in {text!r}")


def rkey_path(text: str) -> str:
    """``<namespace>/<name>`` of a resource key, as logs and the CLI show it (the key as it
    is, should it not parse)."""
    try:
        return parse_rkey(text).path
    except ValueError:
        return text


def shard_of(resource_key: str) -> int:
    """The shard that owns a resource key: stable across processes and versions."""
    return zlib.crc32(resource_key.encode()) % NUM_SHARDS


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class Keys:
    """Key names under one configurable prefix (several deployments can share a Redis)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not prefix or any(c in prefix for c in "{} "):
            raise ValueError(f"invalid key prefix {prefix!r}")
        self.prefix = prefix

    def _shard(self, shard: int) -> str:
        if not 0 <= shard < NUM_SHARDS:
            raise ValueError(f"shard {shard} out of range 0..{NUM_SHARDS - 1}")
        return f"{self.prefix}:{{s{shard}}}"

    # per shard
    def ingress(self, shard: int) -> str:
        return f"{self._shard(shard)}:ingress"

    def outbox(self, shard: int) -> str:
        return f"{self._shard(shard)}:outbox"

    def gm_outbox(self, shard: int) -> str:
        return f"{self._shard(shard)}:gm-outbox"

    def timers(self, shard: int) -> str:
        return f"{self._shard(shard)}:timers"

    def effects(self, shard: int) -> str:
        return f"{self._shard(shard)}:effects"

    def index(self, shard: int) -> str:
        return f"{self._shard(shard)}:index"

    def lease(self, shard: int) -> str:
        return f"{self._shard(shard)}:lease"

    def fence(self, shard: int) -> str:
        return f"{self._shard(shard)}:fence"

    def broken(self, shard: int) -> str:
        """Quarantine marks of the shard's resources: a hash rkey -> mark."""
        return f"{self._shard(shard)}:broken"

    def seen(self, shard: int, dedupe: str) -> str:
        """Dedupe marker; the caller's key is digested so any string is a safe key part."""
        return f"{self._shard(shard)}:seen:{_digest(dedupe)}"

    # per resource (in the resource's shard)
    def state(self, resource_key: str) -> str:
        return f"{self._shard(shard_of(resource_key))}:state:{resource_key}"

    def resource(self, resource_key: str) -> str:
        return f"{self._shard(shard_of(resource_key))}:resource:{resource_key}"

    def history(self, resource_key: str) -> str:
        return f"{self._shard(shard_of(resource_key))}:history:{resource_key}"

    def rounds(self, resource_key: str) -> str:
        """A job's round history: one JSON record per round (and per rollback), capped."""
        return f"{self._shard(shard_of(resource_key))}:rounds:{resource_key}"

    # global
    def ingress_lease(self) -> str:
        """The MQTT-ingress lease; tagged ``{ingress}`` so it shares a slot with its fence."""
        return f"{self.prefix}:{{ingress}}-lease"

    def ingress_fence(self) -> str:
        return f"{self.prefix}:{{ingress}}-fence"

    def ingress_subscribed(self) -> str:
        """The ingress lease token whose holder has its subscription acknowledged."""
        return f"{self.prefix}:{{ingress}}-subscribed"

    def replicas(self) -> str:
        return f"{self.prefix}:replicas"

    def gm_link(self) -> str:
        """What the GM link's holder last said of the link (a JSON value with a TTL)."""
        return f"{self.prefix}:gm-link"

    def output_claims(self) -> str:
        """Which job writes to which outputDir: one sorted set of every claim (see
        ``claim.lua``), so one script sees a directory's claims, those inside it and those on
        the directories above it, in a single slot."""
        return f"{self.prefix}:output-claims"

    def dlq(self) -> str:
        return f"{self.prefix}:dlq"

    def dataset_jobs(self, dataset: str) -> str:
        """Jobs using a dataset (the dataset's resource key)."""
        return f"{self.prefix}:dataset-jobs:{dataset}"

    def barrier(self, key: str) -> str:
        """A scratch key in ``key``'s hash slot (so on a Cluster on its node), written after
        reads to make a WAIT cover everything they saw; its value means nothing."""
        return f"{self.prefix}:{{{hash_tag(key)}}}:barrier"


def hash_tag(key: str) -> str:
    """What Redis hashes to find a key's slot: the part inside the first ``{...}`` when it is
    not empty, else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key
