"""The results as a terminal table and as the Markdown table docs/performance.md carries."""

from __future__ import annotations

from bench.common import Result


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _verdict(result: Result) -> str:
    if result.passed is None:
        return ""
    return "ok" if result.passed else "MISS"


def rows(results: list[Result]) -> list[list[str]]:
    return [
        [
            r.id,
            r.name,
            f"{_num(r.value)} {r.unit}",
            f"{_num(r.baseline)} ({r.baseline_name})" if r.baseline is not None else "-",
            _num(r.ratio),
            r.target,
            _verdict(r),
        ]
        for r in results
    ]


HEADER = ["id", "figure", "value", "baseline", "ratio", "target", ""]


def text_table(results: list[Result]) -> str:
    table = [HEADER, *rows(results)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(results: list[Result]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    return "\n".join(lines)
