"""The per-byte loops of datasets and round files (``_lines.c``): the line census (counts
and line ends of newline-split bytes, in one vectorised pass) and a round's index entries;
big buffers are scanned without the interpreter lock."""

def count(data: bytes | bytearray | memoryview, /) -> tuple[int, int]:
    """``(lines, empty)``: the b"\\n" count of ``data`` and how many of those end an empty
    line (one at the very start, or right after another b"\\n")."""

def end_of_line(data: bytes | bytearray | memoryview, k: int, /) -> int:
    """The offset just past the ``k``-th b"\\n" of ``data`` (0 for k = 0); ``ValueError``
    if it holds fewer."""

def first_fields(data: bytes | bytearray | memoryview, /) -> bytes:
    """Each line's first field (up to its first b" ", or all of it), each followed by
    b"\\n": a round's index entries. ``ValueError`` unless ``data`` is whole lines."""
