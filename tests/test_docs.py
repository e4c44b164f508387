"""The documentation stays true to the tree: every module is in the code map."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_is_in_the_code_map() -> None:
    code_map = (ROOT / "docs" / "architecture.md").read_text()
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "service").rglob("*.py"))
    missing = [m for m in modules if f"`{m}`" not in code_map]
    assert not missing, f"add to docs/architecture.md's code map: {missing}"
    rows = [line for line in code_map.splitlines() if line.startswith("| `service/")]
    listed = [row.split("`")[1] for row in rows]
    gone = [m for m in listed if not (ROOT / m).exists()]
    assert not gone, f"docs/architecture.md's code map lists modules that are gone: {gone}"
