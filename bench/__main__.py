"""`python -m bench [--full]`: run every benchmark on private servers, print the table and
write bench/results.json.

Quick mode (`make bench`) keeps under ~3 minutes on 2 cores; `--full` uses the large sizes
(1,000 jobs x many reports, 1M-line datasets, 10,000 idle jobs over 60 s, 20 failovers).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench import baselines, decode, files, gm, idle, lifecycle, replicated
from bench.common import Controller, Result, Stack, scratch, sentinel_stack, stack
from bench.report import markdown_table, text_table


@dataclass(frozen=True)
class Sizes:
    round_trips: int
    relay_burst: int
    latency_jobs: int
    throughput_jobs: int
    reports: int
    dataset_lines: int
    idle_jobs: int
    idle_window_s: int
    failover_trials: int
    gm_rounds: int


#: Each size in the three modes, side by side: quick (`make bench`), `--full`, and `--smoke`.
#: Smoke's toy sizes make every suite run and yield its figures in about a minute, which
#: proves the benchmarks still work (the test suite runs this) and measures nothing worth
#: keeping.
_MODES: dict[str, tuple[int, int, int]] = {
    "round_trips": (500, 2_000, 20),
    "relay_burst": (5_000, 20_000, 200),
    "latency_jobs": (250, 500, 3),
    "throughput_jobs": (1_000, 1_000, 5),
    "reports": (5_000, 20_000, 100),
    "dataset_lines": (1_000_000, 1_000_000, 2_000),
    "idle_jobs": (1_000, 10_000, 10),
    "idle_window_s": (20, 60, 2),
    "failover_trials": (3, 20, 1),
    "gm_rounds": (9, 20, 1),
}
QUICK, FULL, SMOKE = (
    Sizes(**{size: modes[mode] for size, modes in _MODES.items()}) for mode in range(3)
)
SUITES = ("latency", "throughput", "datasets", "idle", "failover", "sentinel", "decode", "gm")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--full", action="store_true", help="the large sizes (about 15 minutes)")
    sizes.add_argument(
        "--smoke", action="store_true", help="toy sizes: check that every suite still runs"
    )
    parser.add_argument("--only", nargs="+", choices=SUITES, help="run only these suites")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results.json")
    parser.add_argument(
        "--controller-log",
        default="WARNING",
        help="log level of the controllers (the service ships INFO)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table too")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> list[Result]:
    sizes = FULL if args.full else SMOKE if args.smoke else QUICK
    wanted = set(args.only or SUITES)
    Controller.log_level = args.controller_log.upper()
    results: list[Result] = []
    with scratch(args.keep) as root:

        def suite(
            name: str, fn: Callable[[Stack], list[Result]], sentinel_replicas: int = 0
        ) -> None:
            """Run ``fn`` on fresh servers: a single Redis, or one behind Sentinel with that
            many replicas."""
            started = time.monotonic()
            print(f"[bench] {name}...", file=sys.stderr, flush=True)
            servers = (
                sentinel_stack(root, name, sentinel_replicas)
                if sentinel_replicas
                else stack(root, name)
            )
            with servers as s:
                results.extend(fn(s))
            print(f"[bench] {name}: {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)

        box: list[baselines.Floors] = []

        def base(s: Stack) -> list[Result]:
            floors, found = baselines.measure(
                s, round_trips=sizes.round_trips, burst=sizes.relay_burst
            )
            box.append(floors)
            return found

        suite("baselines", base)
        floors = box[0]
        if "latency" in wanted:
            lifelong: list[Result] = []

            def latency(s: Stack) -> list[Result]:
                lifelong.extend(lifecycle.transition_latency(s, floors, jobs=sizes.latency_jobs))
                return lifelong

            suite("latency", latency)
            suite(
                "incremental-latency",
                lambda s: lifecycle.incremental_latency(s, lifelong, jobs=sizes.latency_jobs),
            )
        if "throughput" in wanted:
            suite(
                "throughput",
                lambda s: lifecycle.throughput(
                    s, floors, jobs=sizes.throughput_jobs, reports=sizes.reports
                ),
            )
        if "datasets" in wanted:
            lines = sizes.dataset_lines
            suite(
                "datasets",
                lambda s: (
                    files.ingestion(s, lines=lines, appended=lines // 100)
                    + files.round_file(s, samples=lines)
                ),
            )
        if "idle" in wanted:
            suite(
                "idle",
                lambda s: idle.idle_cost(
                    s,
                    jobs=sizes.idle_jobs,
                    window_s=sizes.idle_window_s,
                    check_period_s=sizes.idle_window_s,
                ),
            )
        if "failover" in wanted:
            suite(
                "failover",
                lambda s: lifecycle.failover(s, trials=sizes.failover_trials, lease_s=3.0),
            )
        if "sentinel" in wanted:
            single = {r.id: r.value for r in results}
            suite(
                "sentinel-latency",
                lambda s: replicated.latency(s, floors, single, jobs=sizes.latency_jobs),
                sentinel_replicas=1,
            )
            suite(
                "sentinel-throughput",
                lambda s: replicated.throughput(
                    s, single, jobs=sizes.throughput_jobs, reports=sizes.reports
                ),
                sentinel_replicas=1,
            )
            suite(
                "sentinel-failover",
                lambda s: replicated.failover(s, trials=sizes.failover_trials),
                sentinel_replicas=2,
            )
        if "decode" in wanted:  # in this process: no servers
            print("[bench] decode...", file=sys.stderr, flush=True)
            results.extend(decode.decode_cost())
        if "gm" in wanted:
            suite("gm", lambda s: gm.round_time(s, rounds=sizes.gm_rounds))
    return results


def machine() -> dict[str, str]:
    def version(argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
        except OSError:
            return "?"
        return (done.stdout or done.stderr).strip().splitlines()[0]

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "redis": version(["redis-server", "--version"]),
        "mosquitto": version(["mosquitto", "-h"]),
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    results = run(args)
    elapsed_s = time.monotonic() - started
    report = {
        "mode": "full" if args.full else "smoke" if args.smoke else "quick",
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "elapsed_s": round(elapsed_s, 1),
        "controller_log_level": args.controller_log.upper(),
        "machine": machine(),
        "results": [r.as_dict() for r in results],
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(text_table(results))
    if args.markdown:
        print(markdown_table(results))
    print(f"{len(results)} figures in {elapsed_s:.0f}s; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
