"""`make bench` keeps working: every suite at toy sizes (`python -m bench --smoke`) yields
each figure bench/results.json holds, with a value. A change that breaks a benchmark (a
report the controller now refuses, a renamed figure) fails here, not in the next bench run.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_benchmark_still_yields_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        check=False,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    smoke = json.loads(out.read_text())
    assert smoke["mode"] == "smoke"
    kept = json.loads((REPO / "bench" / "results.json").read_text())
    assert [r["id"] for r in smoke["results"]] == [r["id"] for r in kept["results"]]
    for result in smoke["results"]:
        assert isinstance(result["value"], int | float), result
        assert math.isfinite(result["value"]) and result["value"] >= 0, result
