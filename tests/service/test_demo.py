"""`lifelong demo` end to end, as `make demo` runs it: two rounds deployed, at least one held
back by the deploy gate, the last line, exit 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

DEMO = [sys.executable, "-m", "service.cli", "demo", "--fast"]
BUDGET_S = 60
LAST_LINE = re.compile(
    r"demo complete: (?P<rounds>\d+) rounds, (?P<deployed>\d+) deployed, (?P<held>\d+) held "
    r"back by the deploy gate, last accuracy (?P<acc>0\.\d\d|1\.00), "
    r"(?P<samples>\d+) samples, \d+s"
)
DECIDED = re.compile(r"round (?P<version>\d+): (?P<what>deployed|held back by the deploy gate) ")


def children_of(pid: int) -> list[int]:
    found = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    )
    return [int(p) for p in found.stdout.split()]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_demo_completes_two_rounds_within_budget() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [*DEMO, "--rounds", "2", "--timeout-seconds", str(BUDGET_S - 5)],
        capture_output=True,
        text=True,
        timeout=BUDGET_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    match = LAST_LINE.fullmatch(lines[-1])
    assert match is not None, lines[-5:]
    assert int(match["deployed"]) == 2
    # a real model on generated data: far better than guessing
    assert float(match["acc"]) >= 0.7
    assert int(match["samples"]) >= 2 * 200
    # not a TTY: plain progress lines, every round's deploy decision in order; the gate
    # (accuracy_delta > 0.05) deploys round 1 (nothing to beat) and holds back the rounds
    # trained within the same season of the drifting data
    decided = [m for m in map(DECIDED.match, lines) if m is not None]
    assert [int(m["version"]) for m in decided] == list(range(1, len(decided) + 1))
    assert decided[0]["what"] == "deployed" and decided[-1]["what"] == "deployed"
    held = [m for m in decided if m["what"] != "deployed"]
    assert len(held) >= 1, "the demo shows a round held back by the deploy gate"
    assert (int(match["rounds"]), int(match["held"])) == (len(decided), len(held))
    assert int(match["deployed"]) + int(match["held"]) == int(match["rounds"])
    assert decided[0].string.endswith("(accuracy_delta: nothing deployed to beat)")
    assert any(
        line.startswith("round 2: eval accuracy") and "(deployed model 0." in line
        for line in lines
    )
    held_line = held[0].string
    assert re.search(r"\(accuracy_delta = [+-]0\.\d\d, needs > 0\.05\)$", held_line), held_line
    assert time.monotonic() - started < BUDGET_S


def test_demo_stops_everything_it_started_on_sigterm() -> None:
    with subprocess.Popen(
        DEMO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=os.environ
    ) as proc:
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()  # the first round started: everything is up
            assert first.startswith("round 1:"), first
            started = children_of(proc.pid)
            assert len(started) >= 4  # mosquitto, redis-server, two controllers
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in started if alive(pid)]
