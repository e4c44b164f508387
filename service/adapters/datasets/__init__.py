"""Incremental reading of dataset sources (local files and S3 objects), and the one definition
of a sample that dataset polls and round files share.

- `sources`: opening local files and S3 objects, reading them into reused buffers,
  translating their errors.
- `scanner`: `SampleScanner`, the definition of a sample, read in blocks; its `LineCensus`
  counts lines with numpy.
- `reader`: `DatasetReader`, polls that read only what was appended since the `Cursor`.

The names other code uses are importable from this package.
"""

from service.adapters.datasets.reader import Cursor, DatasetReader, Poll
from service.adapters.datasets.scanner import (
    TAIL_BYTES,
    SampleScanner,
    iter_batches,
    sample_lines,
)
from service.adapters.datasets.sources import ReadInto, read_exact

__all__ = [
    "TAIL_BYTES",
    "Cursor",
    "DatasetReader",
    "Poll",
    "ReadInto",
    "SampleScanner",
    "iter_batches",
    "read_exact",
    "sample_lines",
]
