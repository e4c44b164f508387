"""What a transition takes from outside (`Context`) and gives back (`Outcome`), and the
`Recorder` its handlers write effects to."""

from __future__ import annotations

from typing import Literal

import msgspec

from service.core.effects import Effect, Note, Publish, Reject, ScheduleCheck, gm_accepts
from service.core.state import State
from service.wire import DatasetStatus, JobStatus

#: applied: the event changed the resource or made it say something; ignored: it changed
#: nothing but bookkeeping; rejected: it was refused (a `Reject` effect says why).
Verdict = Literal["applied", "ignored", "rejected"]


class Context(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Everything from outside a transition may depend on: time, ids and settings."""

    now_ms: int
    minute_of_day: int  # local time, for timer windows
    event_id: str  # unique per event; effect ids derive from it
    volume_prefix: str = ""
    dataset_poll_ms: int = 60_000
    #: how long a ready sent to Sedna's GM may go unseen before it is sent again
    gm_resend_ms: int = 30_000


class Outcome(msgspec.Struct, frozen=True):
    """The next state (None: the resource is gone), the effects, and the verdict."""

    state: State | None
    effects: tuple[Effect, ...] = ()
    verdict: Verdict = "applied"

    @property
    def rejection(self) -> Reject | None:
        return next((e for e in self.effects if isinstance(e, Reject)), None)

    @property
    def notes(self) -> tuple[str, ...]:
        """What the transition said: its notes and refusals, in order."""
        return tuple(e.reason for e in self.effects if isinstance(e, Note | Reject))


class Recorder:
    """Collects the effects of one transition and numbers their ids from the event's id."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.effects: list[Effect] = []

    def next_id(self) -> str:
        return f"{self.ctx.event_id}/{len(self.effects)}"

    def add(self, effect: Effect) -> None:
        self.effects.append(effect)

    def note(self, reason: str) -> None:
        self.add(Note(reason=reason))

    def publish(
        self,
        namespace: str,
        name: str,
        status: JobStatus | DatasetStatus,
        *,
        to_gm: bool = True,
    ) -> None:
        """An upstream status; Sedna's GM gets it too when it accepts it and `to_gm`."""
        publish = Publish(
            id=self.next_id(), namespace=namespace, name=name, status=status,
            to_gm=to_gm and gm_accepts(status),
        )  # fmt: skip
        self.add(publish)

    def schedule(self, due_ms: int) -> None:
        self.add(ScheduleCheck(due_ms=due_ms))
