"""S3 plumbing shared by the dataset reader and the blob writer.

One place builds boto3 clients (per credential, cached: building a client costs tens of
milliseconds and a controller polls many datasets with the same credential) and one place
turns botocore's exceptions into ours, so callers only ever see ``BlobUnavailable`` (retry)
or ``PermanentError`` (give up). botocore's own retries are switched off: the callers retry
with their own budget and backoff, and stacking two retry loops multiplies the wait.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

import boto3
import boto3.exceptions
import botocore.exceptions
from botocore.config import Config

from service.errors import BlobUnavailable, PermanentError, ServiceError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

DEFAULT_REGION = "us-east-1"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        # We read with IfMatch so a ranged read sees one version; the object changed between
        # our HEAD and GET, which the next attempt simply sees.
        "PreconditionFailed",
    }
)
_TRANSIENT_BOTOCORE = (
    botocore.exceptions.ConnectionError,
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.IncompleteReadError,
    OSError,
)
_NO_CREDENTIALS = (
    botocore.exceptions.NoCredentialsError,
    botocore.exceptions.PartialCredentialsError,
)


class S3CredentialLike(Protocol):
    """What a dataset's or job's S3 credential carries (``service.wire.S3Credential``)."""

    @property
    def endpoint(self) -> str | None: ...

    @property
    def use_https(self) -> bool: ...

    @property
    def access_key_id(self) -> str | None: ...

    @property
    def secret_access_key(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class S3Location:
    """A bucket and key parsed from ``s3://bucket/key``."""

    bucket: str
    key: str


def is_s3_url(url: str) -> bool:
    """True for ``s3://`` URLs; everything else is a local path."""
    return url.startswith("s3://")


def parse_s3_url(url: str) -> S3Location:
    """Split ``s3://bucket/key`` (callers validated the scheme; a bad URL is a ValueError)."""
    parts = urlsplit(url)
    key = parts.path.lstrip("/")
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"not an s3://bucket/key URL: {url!r}")
    return S3Location(bucket=parts.netloc, key=key)


def _endpoint_url(cred: S3CredentialLike) -> str | None:
    """Sedna's ``s3-endpoint`` is usually a bare ``host:port``; add the scheme it implies."""
    endpoint = (cred.endpoint or "").strip()
    if not endpoint:
        return None
    if "://" in endpoint:
        return endpoint
    return f"{'https' if cred.use_https else 'http'}://{endpoint}"


def _client_config(path_style: bool) -> Config:
    return Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": "path"} if path_style else None,
    )


class S3Clients:
    """A small cache of boto3 S3 clients, one per distinct credential.

    A ``None`` credential means boto3's standard chain (environment, profile, instance role,
    ``AWS_ENDPOINT_URL``). Each client gets its own boto3 Session because the default session
    is not safe to build clients from concurrently; built clients are thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[tuple[str | None, bool, str | None, str | None], S3Client] = {}

    def client(self, cred: S3CredentialLike | None) -> S3Client:
        key = (
            (None, True, None, None)
            if cred is None
            else (cred.endpoint, cred.use_https, cred.access_key_id, cred.secret_access_key)
        )
        with self._lock:
            found = self._clients.get(key)
            if found is None:
                try:
                    found = self._build(cred)
                except ValueError as e:  # botocore's verdict on a malformed endpoint URL
                    raise PermanentError(f"invalid S3 endpoint: {e}") from e
                self._clients[key] = found
            return found

    @staticmethod
    def _build(cred: S3CredentialLike | None) -> S3Client:
        session = boto3.session.Session()
        region = session.region_name or DEFAULT_REGION
        if cred is None:
            return session.client("s3", region_name=region, config=_client_config(False))
        endpoint = _endpoint_url(cred)
        return session.client(
            "s3",
            region_name=region,
            endpoint_url=endpoint,
            aws_access_key_id=cred.access_key_id or None,
            aws_secret_access_key=cred.secret_access_key or None,
            config=_client_config(endpoint is not None),
        )


def client_error_code(e: botocore.exceptions.ClientError) -> tuple[str, int]:
    """The S3 error code and HTTP status of a ClientError (``("", 0)`` when absent)."""
    error = e.response.get("Error", {})
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return str(error.get("Code", "")), int(status or 0)


def is_not_found(e: Exception) -> bool:
    """NoSuchKey / NoSuchBucket / a bare 404 (HEAD responses carry no error code)."""
    if not isinstance(e, botocore.exceptions.ClientError):
        return False
    code, status = client_error_code(e)
    return code in {"NoSuchKey", "NoSuchBucket", "404", "NotFound"} or status == 404


def _translate_client_error(e: botocore.exceptions.ClientError, context: str) -> ServiceError:
    code, status = client_error_code(e)
    # Only the code and status: server messages can echo request details we do not control.
    what = f"{context}: S3 error {code or 'unknown'} (HTTP {status})"
    if code in _TRANSIENT_CODES or status >= 500 or status == 429:
        return BlobUnavailable(what)
    return PermanentError(what)


def translate(e: Exception, context: str = "s3") -> ServiceError:
    """Turn a boto3/botocore exception into BlobUnavailable (retry) or PermanentError.

    ``context`` says what we were doing (``"reading s3://b/k"``); credentials never appear.
    """
    if isinstance(e, ServiceError):
        return e
    if isinstance(e, boto3.exceptions.S3UploadFailedError) and isinstance(
        e.__context__, Exception
    ):
        return translate(e.__context__, context)
    if isinstance(e, boto3.exceptions.RetriesExceededError):
        return BlobUnavailable(f"{context}: S3 transfer retries exceeded")
    if isinstance(e, botocore.exceptions.ClientError):
        return _translate_client_error(e, context)
    if isinstance(e, _TRANSIENT_BOTOCORE):
        return BlobUnavailable(f"{context}: S3 endpoint unavailable ({type(e).__name__})")
    if isinstance(e, _NO_CREDENTIALS):
        return PermanentError(f"{context}: no usable S3 credentials ({type(e).__name__})")
    return PermanentError(f"{context}: S3 request failed ({type(e).__name__})")
