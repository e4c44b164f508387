"""How the store's operations reach Redis: commands and Lua script calls in one round trip,
replica confirmations attached, library errors translated.

Scripts run via EVALSHA. They are loaded on every new connection (``connect``), and should
they still be missing (``SCRIPT FLUSH``) they are loaded again and the refused calls retried
once. Errors leave as the service's: connection-level failures, a topology in motion and
unconfirmed writes as ``StoreUnavailable``, a fenced script as ``LeaseLost``, anything else
as ``PermanentError``.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
from redis.exceptions import NoScriptError, RedisClusterException, ResponseError

from service.adapters.redis_links import Confirm, Link, NotReplicated, Routed
from service.errors import LeaseLost, PermanentError, StoreUnavailable
from service.keys import Keys

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
#: The scripts beside this module, ``<name>.lua`` each.
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
        text = resources.files(__package__).joinpath(f"{name}.lua").read_text()
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
