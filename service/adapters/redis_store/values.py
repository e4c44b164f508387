"""What the store takes and gives: commits and quarantines to apply, ingress and outbox
entries read back. Plain frozen values; the store encodes and decodes them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OutboxEntry:
    """One upstream message, written with the state that caused it; ``id`` is stable."""

    id: str
    topic: str
    payload: bytes


@dataclass(frozen=True)
class Unreadable:
    """A queue entry that cannot be read as what its queue holds (written by something other
    than this service): why, and its bytes as found, for the dead-letter stream."""

    reason: str
    raw: bytes


@dataclass(frozen=True)
class IngressEntry:
    """One ingress stream entry: an encoded event, or a fired timer for ``timer_rkey``."""

    shard: int
    entry_id: str
    event: bytes | None
    timer_rkey: str | None
    timer_due_ms: int | None


@dataclass(frozen=True)
class Commit:
    """Everything one transition of one resource writes, applied all-or-nothing.

    ``delete`` removes state, resource, timer, histories and index membership (``state`` must
    then be None); ``keep_state`` leaves the state untouched (a rejected or ignored event);
    otherwise ``state`` is the new state. ``timer_due_ms``: None unchanged, -1 cancel.
    """

    rkey: str
    state: bytes | None
    delete: bool = False
    keep_state: bool = False
    resource: bytes | None = None
    timer_due_ms: int | None = None
    ack_ids: tuple[str, ...] = ()
    outbox: tuple[OutboxEntry, ...] = ()
    effects: tuple[tuple[str, bytes], ...] = ()
    history: tuple[bytes, ...] = ()
    #: upstream messages for the GM link, (id, envelope JSON), when a GM is configured
    gm: tuple[tuple[str, bytes], ...] = ()
    #: records of the job's rounds that ended, for its capped round history
    rounds: tuple[bytes, ...] = ()
    clear_mark: bool = False  # the resource's quarantine ended

    def __post_init__(self) -> None:
        if self.delete and (self.state is not None or self.keep_state):
            raise ValueError(f"{self.rkey}: delete takes neither state nor keep_state")
        if not self.delete and not self.keep_state and self.state is None:
            raise ValueError(f"{self.rkey}: state is None without delete or keep_state")


@dataclass(frozen=True)
class Quarantine:
    """Entries taken out of the ingress (their records dead-lettered by the caller) and,
    unless ``rkey`` is None (entries of no known resource), the resource's quarantine mark
    set (``mark``) and a retry timer (``retry_at_ms``) set; applied all-or-nothing."""

    rkey: str | None
    ack_ids: tuple[str, ...]
    mark: bytes | None = None
    retry_at_ms: int | None = None
