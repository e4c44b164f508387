"""What the GM link reports: its state, for ``/readyz`` and ``describe``, and the metrics
hooks it calls as frames pass and the connection comes and goes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

LinkStatus = Literal["disabled", "connecting", "up", "down"]
Direction = Literal["in", "out"]


@dataclass(frozen=True)
class LinkState:
    """What `/readyz` and ``describe`` show of the link.

    ``since`` is when ``status`` last changed (``time.time()``); ``last_error`` why the latest
    dial failed or connection ended (kept after the link is up again, None if none has);
    ``reconnects`` counts the times the link came back up after having been up.
    """

    status: LinkStatus
    since: float
    last_error: str | None = None
    reconnects: int = 0
    frames_in: int = 0
    frames_out: int = 0


class GmObserver(Protocol):
    """Metrics hooks; called on the link's thread (``frame("out")`` on the sender's)."""

    def frame(self, direction: Direction) -> None: ...

    def reconnected(self) -> None: ...

    def link_up(self, up: bool) -> None: ...

    def reading_paused(self, paused: bool) -> None: ...


class NoObserver:
    """The observer of a link nobody measures."""

    def frame(self, direction: Direction) -> None:
        pass

    def reconnected(self) -> None:
        pass

    def link_up(self, up: bool) -> None:
        pass

    def reading_paused(self, paused: bool) -> None:
        pass
