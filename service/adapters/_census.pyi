"""The sample scanner's line census (``_census.c``): counts and line ends of
newline-split bytes, in one vectorised pass without the interpreter lock."""

def count(data: bytes | bytearray | memoryview, /) -> tuple[int, int]:
    """``(lines, empty)``: the b"\\n" count of ``data`` and how many of those end an empty
    line (one at the very start, or right after another b"\\n")."""

def end_of_line(data: bytes | bytearray | memoryview, k: int, /) -> int:
    """The offset just past the ``k``-th b"\\n" of ``data`` (0 for k = 0); ``ValueError``
    if it holds fewer."""
