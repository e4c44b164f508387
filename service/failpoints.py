"""Named crash points for fault tests: die here, like SIGKILL, when the environment says so.

Fault tests need the process to stop at an exact step of the pipeline (after the broker
delivered but before the event is durable, after the commit but before the outbox went out,
half-way through a file...), which no outside signal can hit reliably. `hit(name)` is a no-op
unless ``LIFELONG_FAILPOINTS`` (comma-separated entries, read once at import) names the point;
then it writes one line to stderr and leaves with ``os._exit(137)``: no ``finally`` blocks,
no atexit handlers, no buffered output flushed, no graceful disconnect. That is the death a
SIGKILL or a power cut gives, which is what the durability design has to survive.

An entry ``name:SECONDS`` stalls there instead, the first time the point is reached: the
thread announces ``failpoint <name>: stalling`` on stderr, sleeps, says ``resuming`` and
carries on. A test watching for the announcement can then break something outside (kill
the Redis master) while the controller sits exactly at that step.

Points (docs/reliability.md): ``intake-before-durable``, ``intake-before-ack``,
``process-before-commit``, ``result-before-commit`` (an effect's result handed over in
process, before the commit that applies it), ``process-before-effects``, ``taken-before-ack``
(a message the intake handed over in process, committed and not yet acknowledged: the moment
``intake-before-ack`` also stops at, for such a message),
``outbox-before-publish``, ``blob-mid-write``, ``blob-mid-copy``.
"""


import os
import sys
import threading
import time
from typing import Protocol

ENV_VAR = "LIFELONG_FAILPOINTS"
EXIT_CODE = 137  # what a shell reports for a SIGKILLed child (128 + 9)


class _Flushable(Protocol):
    def flush(self) -> None: ...


def _armed(raw: str) -> dict[str, float | None]:
    """Point name -> seconds to stall (None: exit)."""
    armed: dict[str, float | None] = {}
    for entry in raw.split(","):
        name, colon, seconds = entry.strip().partition(":")
        if not name:
            continue
        try:
            armed[name] = float(seconds) if colon else None
        except ValueError:
            raise ValueError(f"{ENV_VAR}: {entry!r}: stall seconds must be a number") from None
    return armed


_ARMED = _armed(os.environ.get(ENV_VAR, ""))
_stalled: set[str] = set()
_lock = threading.Lock()


def hit(name: str, *flush: _Flushable) -> None:
    """Die at once (or stall, once) if ``name`` is armed; otherwise do nothing.

    ``flush``: files whose Python-buffered bytes should reach the kernel first, so the death
    leaves them on disk exactly as a crash after the write(2) calls would (a half-written
    temporary file), instead of losing them with the process's user-space buffers.
    """
    if name not in _ARMED:
        return
    for file in flush:
        file.flush()
    stall_s = _ARMED[name]
    if stall_s is not None:
        _stall(name, stall_s)
        return
    sys.stderr.write(f"failpoint {name}: exiting with {EXIT_CODE}\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)


def _stall(name: str, seconds: float) -> None:
    with _lock:
        if name in _stalled:
            return
        _stalled.add(name)
    sys.stderr.write(f"failpoint {name}: stalling {seconds:g} s\n")
    sys.stderr.flush()
    time.sleep(seconds)
    sys.stderr.write(f"failpoint {name}: resuming\n")
    sys.stderr.flush()
