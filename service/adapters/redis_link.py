"""The link the store's commands travel on: commands and Lua script calls sent to one
server (direct or through Sentinel) or a Cluster in one round trip, replica confirmations
attached, library errors translated.

Every store operation is a list of commands sent in one pipelined exchange, here rather than
through redis-py's pipelines because two things the store needs are out of their reach:

- ``WAIT`` on the connection that took the writes, after them and outside any MULTI/EXEC
  (inside a transaction it never blocks). redis-py's transactional pipeline wraps every
  command in MULTI/EXEC, and its cluster pipeline sends a key-less WAIT to any node.
- Never sending a command twice. redis-py's cluster pipeline re-sends a command whose reply
  timed out, which could apply a commit twice; here a failed exchange is reported and the
  caller decides (the runtime retries whole operations, knowing which are idempotent).

Replies come back as Redis sent them (RESP2, no redis-py response callbacks) with error
replies as values; connection failures are raised as redis-py's errors, which `Commands`
translates. A link never retries.

On one server each thread keeps its connection between calls (`_kept`) instead of taking
one from redis-py's pool and giving it back each time: that costs the pool two locks, a
fork check, its connection statistics and a release event per call, 8-13 us of the 50-60
us of CPU a one-command call takes here. A connection is checked before each use as the
pool checks one it hands out, and goes back to the pool when its thread ends.

Opening a link (`open_link`): every new connection, its handshake done, loads the store's
scripts before it is used, so EVALSHA works on a fresh or restarted Redis, a promoted
replica or a Cluster node. Should they still be missing (``SCRIPT FLUSH``) they are loaded
again and the refused calls retried once. Errors leave as the service's: connection-level
failures, a topology in motion and unconfirmed writes as ``StoreUnavailable``, a fenced
script as ``LeaseLost``, anything else as ``PermanentError``.

(The ``type: ignore`` comments below answer the type stubs, which describe redis-py 4 where
the installed library is newer: ``get_connection()`` without arguments, packed bytes.)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

import hiredis
import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import Connection, ConnectionPool
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.retry import Retry
from redis.sentinel import Sentinel

from service.errors import LeaseLost, PermanentError, StoreUnavailable
from service.keys import Keys
from service.urls import RedisTarget

log = logging.getLogger(__name__)

Arg = bytes | str | int | float
#: Replies that mean the cluster's slot map changed under us: the exchange is reported as
#: failed (``SlotMoved``; the command did not run) and the slot map refreshed.
_TOPOLOGY_REPLIES = (MovedError, AskError, ClusterDownError, TryAgainError)


@dataclass(frozen=True)
class Routed:
    """One command and the key whose hash slot decides the node (None: any node)."""

    key: str | None
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class Confirm:
    """Wait until ``replicas`` replicas hold the exchange's writes, at most ``timeout_ms``.

    ``barrier``: the exchange only reads, and what it read is about to be acted on; a
    barrier write after the reads makes the WAIT cover every write they saw (WAIT counts
    the writes of its own connection, and replication keeps the master's order).
    """

    replicas: int
    timeout_ms: int
    barrier: bool = False


class NotReplicated(Exception):
    """The writes went through on the master but too few replicas confirmed them in time.

    ``results`` holds every command's reply, for a caller that must undo what it wrote.
    """

    def __init__(self, confirmed: int, confirm: Confirm) -> None:
        super().__init__(
            f"only {confirmed} of {confirm.replicas} replica(s) confirmed the write "
            f"within {confirm.timeout_ms} ms"
        )
        self.confirmed = confirmed
        self.results: list[Any] = []


class SlotMoved(redis.ConnectionError):
    """A Cluster node refused a command for a slot it does not serve (any more): that one
    did not run, others of the exchange may have; the slot map is refreshed and the caller
    retries the operation."""


class Link(Protocol):
    """A topology the store talks to."""

    def run(
        self, commands: Sequence[Routed], *, atomic: bool = False, confirm: Confirm | None = None
    ) -> list[Any]:
        """Send the commands in one exchange; their replies in order (errors as values).

        ``atomic``: commands sharing a hash slot run as one MULTI/EXEC (on a single server,
        all of them do). ``confirm``: WAIT for replicas after the writes; raises
        ``NotReplicated`` when too few confirmed (the writes may still have happened)."""
        ...

    def load_scripts(self, texts: Sequence[str]) -> None:
        """SCRIPT LOAD every text on every primary (after a SCRIPT FLUSH)."""
        ...

    def close(self) -> None: ...


@dataclass
class _Exchange:
    """The commands bound for one connection, grouped into transactions when atomic."""

    groups: list[list[int]]  # indexes into the caller's commands
    atomic: bool
    confirm: Confirm | None
    barrier_key: str

    def wire(self, commands: Sequence[Routed]) -> list[tuple[Arg, ...]]:
        sent: list[tuple[Arg, ...]] = []
        for group in self.groups:
            wrapped = self.atomic and len(group) > 1
            sent += [("MULTI",)] if wrapped else []
            sent += [commands[i].args for i in group]
            sent += [("EXEC",)] if wrapped else []
        if self.confirm is not None:
            if self.confirm.barrier:
                sent.append(("SET", self.barrier_key, b"", "PX", 60_000))
            sent.append(("WAIT", self.confirm.replicas, self.confirm.timeout_ms))
        return sent

    def unpack(self, replies: list[Any], results: list[Any]) -> None:
        """Store each command's reply in ``results``."""
        at = 0
        for group in self.groups:
            if not (self.atomic and len(group) > 1):
                for i in group:
                    results[i] = replies[at]
                    at += 1
                continue
            queued = replies[at + 1 : at + 1 + len(group)]
            done = replies[at + 1 + len(group)]
            at += len(group) + 2
            for k, i in enumerate(group):
                if isinstance(done, list):
                    results[i] = done[k]
                else:  # EXECABORT: nothing ran; a command refused when queued says why
                    results[i] = queued[k] if isinstance(queued[k], ResponseError) else done

    def shortfall(self, replies: list[Any]) -> NotReplicated | None:
        """Too few replicas confirmed the writes (WAIT's reply is the last one)."""
        if self.confirm is None:
            return None
        confirmed = replies[-1]
        if isinstance(confirmed, int) and confirmed >= self.confirm.replicas:
            return None
        return NotReplicated(confirmed if isinstance(confirmed, int) else 0, self.confirm)


def _read(connection: Connection) -> Any:
    try:
        return connection.read_response()
    except ResponseError as e:
        return e


@contextlib.contextmanager
def _borrowed(pools: Sequence[ConnectionPool]) -> Iterator[list[Connection]]:
    """A connection from each pool; on any failure each is closed, so none goes back to its
    pool with unread replies on it."""
    taken: list[tuple[ConnectionPool, Connection]] = []
    try:
        for pool in pools:
            taken.append((pool, pool.get_connection()))  # type: ignore[call-arg]
        yield [connection for _, connection in taken]
    except BaseException:
        for _, connection in taken:
            connection.disconnect()
        raise
    finally:
        for pool, connection in taken:
            pool.release(connection)


def _packed(wire: Sequence[tuple[Arg, ...]]) -> bytes:
    """The commands in the Redis protocol, packed by hiredis itself: redis-py's packer
    first re-encodes every argument in Python (half the cost of a commit's call, whose
    arguments are already bytes, str and int, which hiredis takes as they are)."""
    # hiredis's stub types the command as a 1-tuple; it takes any number of arguments
    return b"".join([hiredis.pack_command(args) for args in wire])  # type: ignore[arg-type]


class _Held:
    """A thread's connection of one pool, given back to the pool when the thread ends
    (the holder is that thread's, in a `_Holders`)."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.connection: Connection | None = None

    def __del__(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(Exception):  # a finalizer must not raise
                self.pool.release(self.connection)


class _Holders(threading.local):
    """Per thread: its `_Held` connection of the link's pool (None before its first call)."""

    def __init__(self) -> None:
        self.held: _Held | None = None


@contextlib.contextmanager
def _kept(pool: ConnectionPool, holders: _Holders) -> Iterator[list[Connection]]:
    """The calling thread's connection of ``pool`` (the first call takes one), checked as
    the pool checks one it hands out (reconnected if the server closed it, or if Sentinel
    names another master since); on any failure it is closed and given back, so none is
    kept with unread replies on it."""
    held = holders.held
    if held is None:
        held = holders.held = _Held(pool)
    connection = held.connection
    if connection is None:
        connection = held.connection = pool.get_connection()  # type: ignore[call-arg]
    try:
        _ensure_ready(connection)
        yield [connection]
    except BaseException:
        held.connection = None
        connection.disconnect()
        pool.release(connection)
        raise


def _ensure_ready(connection: Connection) -> None:
    """Connect a kept connection that is not (closed by ``disconnect``: its pool's, or a
    Sentinel-managed one's on finding its master demoted), and make a new one of a
    connection with something to read before anything was sent: the server closed it
    (idle, or restarted) or left a reply on it; what redis-py's pool does for a connection
    it hands out."""
    connection.connect()
    try:
        stale = connection.can_read()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        stale = True
    if stale:
        connection.disconnect()
        connection.connect()


def _exchange(
    borrow: Callable[[], contextlib.AbstractContextManager[list[Connection]]],
    exchanges: Sequence[_Exchange],
    commands: Sequence[Routed],
) -> list[Any]:
    """Write every exchange to its connection (from ``borrow``, one per exchange, in order)
    first, then read them all: one round trip in all, however many nodes take part."""
    results: list[Any] = [None] * len(commands)
    wires = [exchange.wire(commands) for exchange in exchanges]
    with borrow() as connections:
        for connection, wire in zip(connections, wires, strict=True):
            connection.send_packed_command([_packed(wire)])  # type: ignore[list-item]
        replies = [
            [_read(connection) for _ in wire]
            for connection, wire in zip(connections, wires, strict=True)
        ]
    short: NotReplicated | None = None
    for exchange, got in zip(exchanges, replies, strict=True):
        exchange.unpack(got, results)
        short = short or exchange.shortfall(got)
    moved = next((r for r in results if isinstance(r, _TOPOLOGY_REPLIES)), None)
    if moved is not None:  # first: a WAIT on a node that no longer is a master says nothing
        raise SlotMoved(f"cluster slot map changed ({moved}); retry")
    if short is not None:
        short.results = results
        raise short
    return results


class SingleLink:
    """One server: a plain connection pool, or the master Sentinel points at (whose pool
    asks the sentinels again whenever a connection is made)."""

    def __init__(
        self,
        pool: ConnectionPool,
        barrier_key: Callable[[str], str],
        on_close: Callable[[], None] = lambda: None,
    ) -> None:
        self._pool = pool
        self._barrier_key = barrier_key
        self._on_close = on_close
        self._holders = _Holders()

    def run(
        self, commands: Sequence[Routed], *, atomic: bool = False, confirm: Confirm | None = None
    ) -> list[Any]:
        if not commands:
            return []
        indexes = list(range(len(commands)))
        exchange = _Exchange(
            groups=[indexes] if atomic else [[i] for i in indexes],
            atomic=atomic,
            confirm=confirm,
            barrier_key=self._barrier_key(commands[0].key or ""),
        )
        return _exchange(self._connection, [exchange], commands)

    def _connection(self) -> contextlib.AbstractContextManager[list[Connection]]:
        return _kept(self._pool, self._holders)

    def load_scripts(self, texts: Sequence[str]) -> None:
        self.run([Routed(None, ("SCRIPT", "LOAD", text)) for text in texts])

    def run_blocking(
        self, command: Routed, on_blocked: Callable[[int | ResponseError], None]
    ) -> Any:
        """Run a blocking command (a read with BLOCK); its reply (an error as a value).

        ``on_blocked`` is told the client id of its connection once the server holds the
        command, so that another connection can end the wait early (CLIENT UNBLOCK), or the
        error refusing CLIENT ID (an ACL). The id comes from a CLIENT ID written together
        with the command: the server runs both in one pass over what it read and sends
        replies after that pass, so when the id is read, the command is blocked (or
        answered) already. Were the two ever split between reads on the server, an unblock
        could come too early and find nothing to end: the command then waits out its
        BLOCK."""
        with self._connection() as (connection,):
            wire = _packed((("CLIENT", "ID"), command.args))
            connection.send_packed_command([wire])  # type: ignore[list-item]
            on_blocked(_read(connection))
            return _read(connection)

    def close(self) -> None:
        self._pool.disconnect()
        self._on_close()


class ClusterLink:
    """A Redis Cluster: commands go to the primary serving their key's slot, one pipelined
    exchange per node, all nodes in one round trip.

    The client is built on first use (building one connects to the seed nodes, and the
    controller starts before Redis may be reachable). A connection failure or a slot moved
    refreshes the slot map before the failure is reported, so the caller's retry goes to
    the node that serves the slot now (the promoted replica after a failover).
    """

    def __init__(
        self, make: Callable[[], RedisCluster[bytes]], barrier_key: Callable[[str], str]
    ) -> None:
        self._make = make
        self._barrier_key = barrier_key
        self._client: RedisCluster[bytes] | None = None
        self._lock = threading.Lock()

    def _cluster(self) -> RedisCluster[bytes]:
        with self._lock:  # every thread of the controller shares the one client
            if self._client is None:
                self._client = self._make()
            return self._client

    def run(
        self, commands: Sequence[Routed], *, atomic: bool = False, confirm: Confirm | None = None
    ) -> list[Any]:
        if not commands:
            return []
        try:
            return self._run(self._cluster(), commands, atomic, confirm)
        except (redis.ConnectionError, redis.TimeoutError, RedisClusterException):
            self._refresh()
            raise

    def _run(
        self,
        cluster: RedisCluster[bytes],
        commands: Sequence[Routed],
        atomic: bool,
        confirm: Confirm | None,
    ) -> list[Any]:
        by_node: dict[str, tuple[ClusterNode, dict[int | None, list[int]]]] = {}
        for i, command in enumerate(commands):
            slot = None if command.key is None else int(cluster.keyslot(command.key))
            node = _node_for(cluster, slot)
            slots = by_node.setdefault(node.name, (node, {}))[1]
            slots.setdefault(slot, []).append(i)
        nodes = [node for node, _ in by_node.values()]
        exchanges = [
            _Exchange(
                groups=(
                    list(slots.values()) if atomic else [[i] for g in slots.values() for i in g]
                ),
                atomic=atomic,
                confirm=confirm,
                barrier_key=self._barrier_key(commands[next(iter(slots.values()))[0]].key or ""),
            )
            for _, slots in by_node.values()
        ]
        pools = [cluster.get_redis_connection(node).connection_pool for node in nodes]
        return _exchange(lambda: _borrowed(pools), exchanges, commands)

    def _refresh(self) -> None:
        """Re-read the slot map from any node that answers (failures leave the old one)."""
        if self._client is None:
            return
        try:
            self._client.nodes_manager.initialize()
        except (redis.RedisError, RedisClusterException) as e:
            log.debug("cluster slot map not refreshed: %s", e)

    def load_scripts(self, texts: Sequence[str]) -> None:
        cluster = self._cluster()
        for node in cluster.get_primaries():
            pool = cluster.get_redis_connection(node).connection_pool
            load = [Routed(None, ("SCRIPT", "LOAD", text)) for text in texts]
            exchange = _Exchange([[i] for i in range(len(load))], False, None, "")
            _exchange(functools.partial(_borrowed, [pool]), [exchange], load)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _node_for(cluster: RedisCluster[bytes], slot: int | None) -> ClusterNode:
    """The primary serving ``slot`` (None: the client's default node)."""
    found: Any = (
        cluster.get_default_node()
        if slot is None
        else cluster.nodes_manager.get_node_from_slot(slot)  # type: ignore[arg-type]
    )
    if not isinstance(found, ClusterNode):
        raise RedisClusterException(f"no node serves slot {slot}")
    return found


HEALTH_CHECK_INTERVAL_S = 30
#: What a new connection is handed to before it is used.
_Loader = Callable[[Connection], None]


def open_link(
    target: RedisTarget,
    barrier: Callable[[str], str],
    socket_timeout_s: float,
    scripts: Collection[Lua],
) -> Link:
    """The link to ``target``; ``barrier``: the barrier key of a key's hash slot."""
    timeouts: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s,
    }
    load_on = _script_loader(scripts)
    if target.topology == "single":
        return _single(target, barrier, timeouts, load_on)
    if target.topology == "sentinel":
        return _sentinel(target, barrier, timeouts, load_on)
    return _cluster(target, barrier, timeouts, load_on)


def _single(
    target: RedisTarget, barrier: Callable[[str], str], timeouts: dict[str, Any], load_on: _Loader
) -> Link:
    pool = redis.ConnectionPool.from_url(
        target.url,
        protocol=2,  # pinned: the reply shapes the store reads are RESP2's
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        retry=_no_retry(),
        redis_connect_func=_handshake_then(load_on),
        **timeouts,
    )
    return SingleLink(pool, barrier)


def _sentinel(
    target: RedisTarget, barrier: Callable[[str], str], timeouts: dict[str, Any], load_on: _Loader
) -> Link:
    tls = _tls_kwargs(target)
    # the URL's credentials are the data nodes'; sentinels are asked without them
    sentinel = Sentinel(list(target.hosts), sentinel_kwargs={**timeouts, **tls})
    master = sentinel.master_for(
        target.master,
        db=target.db,
        protocol=2,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        retry=_no_retry(),
        redis_connect_func=_handshake_then(load_on),
        username=target.username,
        password=target.password,
        **timeouts,
        **tls,
    )
    close = sentinel.close  # type: ignore[attr-defined]  # (stubs predate it)
    return SingleLink(master.connection_pool, barrier, close)


def _cluster(
    target: RedisTarget, barrier: Callable[[str], str], timeouts: dict[str, Any], load_on: _Loader
) -> Link:
    tls = _tls_kwargs(target)

    def make() -> RedisCluster[bytes]:
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.hosts],
            retry=_no_retry(),
            protocol=2,
            redis_connect_func=load_on,  # the cluster client does the handshake
            username=target.username,
            password=target.password,
            **timeouts,
            **tls,
        )

    return ClusterLink(make, barrier)


def _handshake_then(load_on: _Loader) -> _Loader:
    """Handshake, then load every script."""

    def on_connect(connection: Connection) -> None:
        connection.on_connect()
        load_on(connection)

    return on_connect


def _script_loader(scripts: Collection[Lua]) -> _Loader:
    """Loads every script on a connection, sent back to back: one round trip."""

    def load_on(connection: Connection) -> None:
        for script in scripts:
            connection.send_command("SCRIPT", "LOAD", script.text)
        for _ in scripts:
            connection.read_response()

    return load_on


def _no_retry() -> Retry:
    """No retries: a retried EVALSHA after a timeout could apply twice; the runtime retries
    whole operations above the store."""
    return Retry(NoBackoff(), 0)


def _tls_kwargs(target: RedisTarget) -> dict[str, Any]:
    """redis-py's TLS arguments for a Sentinel or Cluster target (none without TLS)."""
    if not target.tls:
        return {}
    return {"ssl": True, **dict(target.tls_options)}


# Error replies that mean "the server cannot serve right now", not "the request is wrong".
_TRANSIENT_REPLIES = (
    "LOADING",
    "READONLY",
    "OOM",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "NOREPLICAS",
)
#: The scripts in ``redis_scripts/`` beside this module, ``<name>.lua`` each.
SCRIPT_NAMES = (
    "commit",
    "append_ingress",
    "fire_timers",
    "complete_effect",
    "acquire",
    "renew",
    "release",
    "quarantine",
    "claim",
)


@dataclass(frozen=True)
class Lua:
    """A script from ``<name>.lua`` and its SHA1, for EVALSHA.

    Not redis-py's ``Script``: calling one inside a pipeline costs an extra SCRIPT EXISTS
    round trip per execute, which the hot path cannot afford.
    """

    name: str
    text: str
    sha: str

    @classmethod
    def named(cls, name: str) -> Lua:
        text = resources.files(__package__).joinpath("redis_scripts", f"{name}.lua").read_text()
        return cls(name, text, hashlib.sha1(text.encode()).hexdigest())


def load_scripts() -> dict[str, Lua]:
    """Every script of the store, by name."""
    return {name: Lua.named(name) for name in SCRIPT_NAMES}


@dataclass(frozen=True)
class Call:
    """One EVALSHA: a script with its keys and arguments (routed by its first key, every
    key of a call being in one hash slot)."""

    script: Lua
    keys: tuple[str, ...]
    args: tuple[bytes | str | int, ...]

    def routed(self) -> Routed:
        return Routed(
            self.keys[0], ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)
        )


@contextlib.contextmanager
def store_errors(what: str) -> Iterator[None]:
    """Translate redis-py errors into the service's at the adapter boundary."""
    try:
        yield
    except NotReplicated as e:
        raise StoreUnavailable(f"redis {what}: written, but {e}") from e
    except (redis.ConnectionError, redis.TimeoutError, RedisClusterException) as e:
        raise StoreUnavailable(f"redis {what}: {e}") from e
    except ResponseError as e:
        if str(e).startswith(_TRANSIENT_REPLIES):
            raise StoreUnavailable(f"redis {what}: {e}") from e
        raise PermanentError(f"redis {what}: {e}") from e
    except redis.RedisError as e:
        raise PermanentError(f"redis {what}: {e}") from e


def checked(result: Any) -> Any:
    """A reply, or its error raised (a fenced script as ``LeaseLost``)."""
    if isinstance(result, ResponseError):
        if str(result).startswith("FENCED"):
            raise LeaseLost(str(result))
        raise result
    return result


def as_str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def field_map(flat: list[bytes] | None) -> dict[bytes, bytes]:
    """A field/value list as Redis sends it (a stream entry, HGETALL) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True)) if flat else {}


class Commands:
    """The store's one way to Redis: its link, its keys, its scripts and the confirmations
    its writes (``confirm``) and its reads about to be acted on (``barrier``) wait for."""

    def __init__(
        self, link: Link, keys: Keys, scripts: Mapping[str, Lua], replicas: int, wait_ms: int
    ) -> None:
        self.link = link
        self.keys = keys
        self._scripts = scripts
        self.confirm = Confirm(replicas, wait_ms) if replicas > 0 else None
        self.barrier = Confirm(replicas, wait_ms, barrier=True) if replicas > 0 else None

    def call(self, script: str, keys: tuple[str, ...], args: tuple[bytes | str | int, ...]) -> Call:
        """A call of the script named ``script``."""
        return Call(self._scripts[script], keys, args)

    def run(
        self,
        commands: Sequence[Routed],
        *,
        what: str,
        atomic: bool = False,
        confirm: Confirm | None = None,
    ) -> list[Any]:
        """Commands in one round trip; replies as Redis sent them, error replies raised."""
        with store_errors(what):
            return [checked(r) for r in self.link.run(commands, atomic=atomic, confirm=confirm)]

    def eval(
        self, calls: Sequence[Call], *, what: str, confirm: Confirm | None = None
    ) -> list[Any]:
        """Run scripts in one round trip; the first error reply is raised (fenced: LeaseLost)."""
        with store_errors(what):
            return [checked(r) for r in self.eval_raw(calls, what=what, confirm=confirm)]

    def eval_raw(
        self,
        calls: Sequence[Call],
        *,
        what: str,
        atomic: bool = False,
        confirm: Confirm | None = None,
    ) -> list[Any]:
        """Run scripts in one round trip, replies as they came (errors as values); reload and
        retry once the calls refused NOSCRIPT."""
        with store_errors(what):
            routed = [call.routed() for call in calls]
            results = self.link.run(routed, atomic=atomic, confirm=confirm)
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if missing:
                self.link.load_scripts([s.text for s in self._scripts.values()])
                retried = self.link.run(
                    [routed[i] for i in missing], atomic=atomic, confirm=confirm
                )
                for i, result in zip(missing, retried, strict=True):
                    results[i] = result
            return results

    def ping(self) -> bool:
        """Whether Redis answers now (for readiness), never raising."""
        try:
            self.run([Routed(None, ("PING",))], what="ping")
        except (StoreUnavailable, PermanentError):
            return False
        return True
