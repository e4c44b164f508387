"""`lifelong demo` end to end, as `make demo` runs it: two rounds deployed, at least one held
back by the deploy gate, the last line, exit 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from service.demo.scenario import Progress
from tests.wait import wait_until

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
    # The budget is the demo's own: given --timeout-seconds it stops waiting for rounds at
    # that deadline and exits 1 ("demo failed: ..."), so exit 0 and its last line say the
    # rounds finished within it; `timeout=` only keeps a hung demo from hanging the suite.
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
    # (accuracy_delta[0] > 0.05) deploys round 1 (nothing to beat) and holds back the rounds
    # trained within the same season of the drifting data
    decided = [m for m in map(DECIDED.match, lines) if m is not None]
    assert [int(m["version"]) for m in decided] == list(range(1, len(decided) + 1))
    assert decided[0]["what"] == "deployed" and decided[-1]["what"] == "deployed"
    held = [m for m in decided if m["what"] != "deployed"]
    assert len(held) >= 1, "the demo shows a round held back by the deploy gate"
    assert (int(match["rounds"]), int(match["held"])) == (len(decided), len(held))
    assert int(match["deployed"]) + int(match["held"]) == int(match["rounds"])
    assert decided[0].string.endswith("(accuracy_delta[0]: nothing deployed to beat)")
    assert any(
        line.startswith("round 2: eval accuracy") and "(deployed model 0." in line
        for line in lines
    )
    held_line = held[0].string
    assert re.search(r"\(accuracy_delta\[0\] = [+-]0\.\d\d, needs > 0\.05\)$", held_line), held_line


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
    wait_until(
        lambda: not any(alive(pid) for pid in started),
        5,
        "every process the demo started to end",
        detail=lambda: str([pid for pid in started if alive(pid)]),
    )


def test_the_live_view_shows_rounds_held_back_by_the_gate() -> None:
    progress = Progress()

    def status(content: dict[str, object]) -> str | None:
        return progress.update({"header": {}, "content": content})

    gate = {"metric": "accuracy_delta[0]", "operator": ">", "threshold": 0.05, "version": 1}
    status({"phase": "train", "status": "ready", "input": {"outputDir": "/o/train/1"}})
    status({"phase": "eval", "status": "ready", "input": {"outputDir": "/o/eval/1"}})
    assert status({"phase": "deploy", "status": "ready", "input": {},
                   "gate": {**gate, "holds": True}}) == (
        "round 1: deployed (accuracy_delta[0]: nothing deployed to beat)"
    )  # fmt: skip
    status({"phase": "train", "status": "ready", "input": {"outputDir": "/o/train/2"}})
    evaluating = status(
        {
            "phase": "eval",
            "status": "ready",
            "input": {"outputDir": "/o/eval/2", "deployedModel": {"url": "/m"}},
        }
    )
    assert evaluating == "round 2: evaluating on 0 samples (and the deployed model)"
    models = [{"metrics": {"accuracy": [0.91]}}, {"metrics": {"accuracy": [0.9]}}]
    assert status({"phase": "eval", "status": "completed",
                   "output": {"models": models, "ownerInfo": {}}}) == (
        "round 2: eval accuracy 0.91 (deployed model 0.90)"
    )  # fmt: skip
    held = {**gate, "holds": False, "value": 0.01, "version": 2}
    assert status({"phase": "deploy", "status": "completed", "output": {"models": models},
                   "gate": held}) == (
        "round 2: held back by the deploy gate (accuracy_delta[0] = +0.01, needs > 0.05)"
    )  # fmt: skip
    assert (progress.finished, progress.deployed, progress.held_back) == (2, 1, 1)
    console = Console(width=140, record=True)
    console.print(progress.table(3, 5.0))
    view = " ".join(console.export_text().split())  # the caption wraps
    assert "│ 2 │ held back │" in view
    assert "1/3 rounds deployed, 1 held back by the deploy gate (accuracy_delta[0] > 0.05)" in view
