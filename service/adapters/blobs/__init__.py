"""Round sample files and the deploy copy: the controller's writes, local or S3.

- `store`: `BlobStore`, the face the runtime uses; retries each whole call.
- `rounds`: round files, the samples of index ranges copied in forward scans.
- `models`: model copies, within S3, local to S3, or streamed.
- `staging`: temporary files that become their target whole, or not at all.
- `pipelined`: the writer that overlaps writing a big file with reading the next block.

The names other code uses are importable from this package.
"""

from service.adapters.blobs.store import BlobStore

__all__ = ["BlobStore"]
