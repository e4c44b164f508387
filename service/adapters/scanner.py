"""The definition of a sample, in one place: `SampleScanner` splits a byte stream into samples.

Dataset polls count samples with it, and the blob writer streams round files through it, so
that "sample i" means the same line everywhere: lines split on b"\\n", one trailing b"\\r"
stripped, empty lines skipped, the first non-empty csv line is the header, and an
unterminated last line is a sample that is not yet consumed. Blocks are processed with
C-level bytes operations (find, replace) and the line census of `_lines`, this package's
one C module (it counts lines and empty lines in one vectorised pass, about 60 us a MiB
where numpy's five passes took 150-300, and finds where the k-th line ends), never a Python
loop per line, and memory stays at a few blocks whatever the file size: a line longer than
the line cap (``LIFELONG_MAX_LINE_BYTES``) is refused as soon as the scan passes the cap, so
a huge one-line file cannot make the controller hold the line.
"""


from collections.abc import Callable, Iterator
from dataclasses import dataclass

from service.adapters import _lines
from service.errors import Refused

BLOCK_BYTES = 1 << 20
TAIL_BYTES = 64
#: The default line cap; the smallest allowed is one block, because lines are measured only
#: when they span blocks (a line within one block is shorter than the block).
DEFAULT_MAX_LINE_BYTES = BLOCK_BYTES

Chunk = bytes | memoryview
"""Bytes read or scanned; a memoryview is a window on a reused buffer (see where it is made)."""

ReadInto = Callable[[memoryview], int]
"""Fills a prefix of the view with the next bytes of a range; returns how many (0 at the
end). Reading into the caller's buffer, not into new bytes objects, is what keeps big scans
free of allocations."""


@dataclass(frozen=True, slots=True)
class SampleBatch:
    """Complete lines of one block: samples ``first .. first+count``.

    ``body`` is b"\\n"-terminated lines with CRLF folded; it may still contain empty lines
    (``sample_lines`` drops them) and never contains the csv header. It is usually a view of
    the scanner's buffer: valid until the scanner's next ``read_from``.
    """

    first: int
    count: int
    body: Chunk
    clean: bool = True
    """No empty line in ``body``: it is exactly the samples, one per line."""


def sample_lines(body: Chunk) -> list[bytes]:
    """The samples of a batch body, in order."""
    return [line for line in bytes(body).split(b"\n") if line]


def _split_header(folded: bytes) -> tuple[bytes, bytes]:
    """The first non-empty line of ``folded`` and everything after it."""
    start = len(folded) - len(folded.lstrip(b"\n"))
    end = folded.index(b"\n", start)
    return folded[start:end], folded[end + 1 :]


class SampleScanner:
    """Splits a byte stream, fed in blocks from a line boundary, into samples.

    ``offset`` is the absolute end of the last complete line, ``samples`` the number of
    samples before it, ``tail`` the last ``TAIL_BYTES`` bytes before ``offset``. With
    ``keep_lines=False`` (counting only) a long partial line is shortened to two bytes, which
    keeps its emptiness verdict, so one endless line cannot grow memory. Either way, a line
    longer than ``max_line`` bytes (its newline not counted; at least one block) raises
    ``Refused`` naming ``source`` and where the line starts.
    """

    def __init__(
        self,
        fmt: str,
        *,
        offset: int = 0,
        samples: int = 0,
        header_seen: bool = False,
        tail: bytes = b"",
        keep_lines: bool = True,
        expected_bytes: int | None = None,
        max_line: int = DEFAULT_MAX_LINE_BYTES,
        source: str = "the dataset",
    ) -> None:
        if max_line < BLOCK_BYTES:
            raise ValueError(f"a line cap of {max_line} bytes is below one block ({BLOCK_BYTES})")
        # Blocks no bigger than what the range holds: a fresh megabyte costs page faults,
        # which would dominate a poll that finds a few kilobytes appended.
        self._block = (
            BLOCK_BYTES if expected_bytes is None else max(1, min(BLOCK_BYTES, expected_bytes))
        )
        self.offset = offset
        self.samples = samples
        self.header: bytes | None = None
        self.tail = tail[-TAIL_BYTES:]
        self._header_seen = header_seen or fmt != "csv"
        self._recent = self.tail
        self._position = offset
        self._buf = bytearray()
        self._carry_at = 0  # the partial last line is _buf[_carry_at : _carry_at + _carry_len]
        self._carry_len = 0
        self._keep_lines = keep_lines
        self._partial = 0  # the partial line's true length (_carry_len may be shortened)
        self._max_line = max_line
        self._source = source

    def read_from(self, read_into: ReadInto) -> tuple[int, SampleBatch | None]:
        """Read the next block; return its size (0 at the end) and the batch of lines it
        completed, if any.

        The block is read straight into the scanner's reused buffer, behind the partial line
        left over, so no large object is allocated per block (fresh megabytes cost page
        faults that outweigh the scan); the batch body is a view of that buffer.
        """
        buf = self._make_room(self._block)
        carry = self._carry_len
        size = read_into(memoryview(buf)[carry : carry + self._block])
        if size == 0:
            return 0, None
        base = self._position
        self._position += size
        total = carry + size
        end = buf.rfind(b"\n", carry, total)
        if end < 0:
            self._partial += size
            self._check_line(self._partial)
            self._carry_len = self._shortened(total)
            self._remember(buf, carry, total)
            return size, None
        if self._partial + size > self._max_line:  # the first line may pass the cap
            self._check_line(self._partial + buf.find(b"\n", carry, total) - carry)
        line_end = end + 1
        self._partial = total - line_end
        if line_end - carry >= TAIL_BYTES:
            self.tail = bytes(buf[line_end - TAIL_BYTES : line_end])
        else:
            self.tail = (self._recent + bytes(buf[carry:line_end]))[-TAIL_BYTES:]
        self._remember(buf, carry, total)
        self._carry_at, self._carry_len = line_end, self._shortened(total - line_end)
        self.offset = base + line_end - carry
        folded: Chunk = memoryview(buf)[:line_end]
        if buf.find(b"\r", 0, line_end) >= 0:  # memchr speed; most files have no CR at all
            folded = bytes(folded).replace(b"\r\n", b"\n")
        return size, self._batch(folded)

    def _check_line(self, length: int) -> None:
        """Refuse the line starting at ``offset`` if its ``length`` passes the cap."""
        if length > self._max_line:
            raise Refused(
                f"{self._source}: the line at byte {self.offset} is longer than "
                f"{self._max_line} bytes (LIFELONG_MAX_LINE_BYTES)"
            )

    def finish(self) -> SampleBatch | None:
        """The unterminated last line as a one-sample batch (not consumed), if it is one."""
        at = self._carry_at
        line = bytes(self._buf[at : at + self._carry_len])
        line = line[:-1] if line.endswith(b"\r") else line
        if not line or not self._header_seen:
            return None
        return SampleBatch(self.samples, 1, line + b"\n")

    def _remember(self, buf: bytearray, start: int, end: int) -> None:
        """Keep the last TAIL_BYTES of the stream read so far (the block is buf[start:end])."""
        self._recent = (self._recent + bytes(buf[max(end - TAIL_BYTES, start) : end]))[
            -TAIL_BYTES:
        ]

    def _make_room(self, size: int) -> bytearray:
        """Move the partial line to the buffer's front (the previous batch is done with it)
        and make sure ``size`` more bytes fit behind it."""
        buf, at, carry = self._buf, self._carry_at, self._carry_len
        if carry + size > len(buf):
            grown = bytearray(max(carry + size, 2 * len(buf)))
            grown[:carry] = buf[at : at + carry]
            self._buf = buf = grown
        elif at:
            buf[:carry] = buf[at : at + carry]
        self._carry_at = 0
        return buf

    def _batch(self, folded: Chunk) -> SampleBatch:
        first = self.samples
        lines, empty = _lines.count(folded)
        count = lines - empty
        if not self._header_seen and count:
            self.header, folded = _split_header(bytes(folded))
            self._header_seen = True
            count -= 1
            empty = _lines.count(folded)[1]  # the empty lines before the header are gone
        self.samples += count
        return SampleBatch(first, count, folded, clean=empty == 0)

    def _shortened(self, carry: int) -> int:
        """The partial line's kept length (its first two bytes when only counting)."""
        if self._keep_lines or not self._header_seen:
            return carry
        return min(carry, 2)


def iter_batches(read_into: ReadInto, scanner: SampleScanner) -> Iterator[SampleBatch]:
    """Scan the whole range block by block; the unterminated last line comes last."""
    while True:
        size, batch = scanner.read_from(read_into)
        if not size:
            break
        if batch is not None:
            yield batch
    last = scanner.finish()
    if last is not None:
        yield last
