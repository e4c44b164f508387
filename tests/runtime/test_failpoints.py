"""Failpoints: which entries arm a point, and a stall that happens once per process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from service import failpoints


def test_entries_exit_or_stall() -> None:
    assert failpoints._armed("a, b:2.5 ,,c:0") == {"a": None, "b": 2.5, "c": 0.0}
    assert failpoints._armed("") == {}
    with pytest.raises(ValueError, match=r"LIFELONG_FAILPOINTS: 'b:soon'"):
        failpoints._armed("a,b:soon")


def test_a_stall_announces_itself_once_and_carries_on() -> None:
    """In a child process (the points are read at import): the first hit stalls and resumes,
    the second passes, and an exit point still exits with 137."""
    code = (
        "from service import failpoints\n"
        "failpoints.hit('slow')\n"
        "failpoints.hit('slow')\n"
        "print('after both', flush=True)\n"
        "failpoints.hit('die')\n"
        "print('never', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"LIFELONG_FAILPOINTS": "slow:0.01,die", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == failpoints.EXIT_CODE
    assert done.stdout == "after both\n"
    assert done.stderr.splitlines() == [
        "failpoint slow: stalling 0.01 s",
        "failpoint slow: resuming",
        "failpoint die: exiting with 137",
    ]
