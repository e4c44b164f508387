"""The drawings of the lifecycle tables stay true to them: the end of
`service.core.lifecycle`'s docstring and the table section of docs/lifecycle.md are what
`lifecycle.diagram()` draws. `python -m tests.core.test_lifecycle_docs` rewrites both."""

from __future__ import annotations

import textwrap
from pathlib import Path

from service.core import lifecycle

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "service" / "core" / "lifecycle.py"
DOC = ROOT / "docs" / "lifecycle.md"
#: The module docstring's drawing follows this line and runs to the docstring's end.
MODULE_MARK = "`python -m tests.core.test_lifecycle_docs` rewrites both):\n\n"
DOC_START = (
    "<!-- drawn by service.core.lifecycle.diagram(): python -m tests.core.test_lifecycle_docs -->\n"
)
DOC_END = "<!-- end of the drawing -->\n"


def drawn_module(text: str) -> str:
    """The module's source with its docstring's drawing redrawn."""
    start = text.index(MODULE_MARK) + len(MODULE_MARK)
    end = text.index('"""', start)
    return text[:start] + textwrap.indent(lifecycle.diagram(), "    ") + "\n" + text[end:]


def drawn_doc(text: str) -> str:
    """docs/lifecycle.md with its drawing redrawn."""
    start = text.index(DOC_START) + len(DOC_START)
    end = text.index(DOC_END, start)
    return text[:start] + "```text\n" + lifecycle.diagram() + "\n```\n" + text[end:]


def test_the_module_docstring_draws_the_tables() -> None:
    text = MODULE.read_text()
    assert drawn_module(text) == text, "run: python -m tests.core.test_lifecycle_docs"


def test_the_lifecycle_doc_draws_the_tables() -> None:
    text = DOC.read_text()
    assert drawn_doc(text) == text, "run: python -m tests.core.test_lifecycle_docs"


if __name__ == "__main__":
    MODULE.write_text(drawn_module(MODULE.read_text()))
    DOC.write_text(drawn_doc(DOC.read_text()))
