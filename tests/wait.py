"""The one way tests wait: for a condition, never for a fixed time."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.05


def wait_until(
    predicate: Callable[[], T | None],
    timeout_s: float,
    what: str,
    *,
    condition: threading.Condition | None = None,
    detail: Callable[[], str] | None = None,
) -> T:
    """The predicate's first truthy result; TimeoutError naming `what` after `timeout_s`.

    With `condition`, the predicate is checked under it and re-checked whenever it is
    notified (at least every POLL_S); otherwise it is polled every POLL_S. `detail` adds
    what was seen to the timeout's message.
    """
    deadline = time.monotonic() + timeout_s
    with condition if condition is not None else contextlib.nullcontext():
        while True:
            result = predicate()
            if result:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seen = f"; got {detail()}" if detail is not None else ""
                raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}{seen}")
            if condition is not None:
                condition.wait(min(remaining, POLL_S))
            else:
                time.sleep(min(remaining, POLL_S))
