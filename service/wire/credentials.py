"""S3 credentials a resource names in its `sedna.io/credential` annotation.

This is where secrets pass by: the credential's repr never shows the secret, and error
reasons name fields only, never values.
"""

from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

from service.errors import InvalidMessage
from service.wire.fields import invalid
from service.wire.resources import CREDENTIAL_ANNOTATION, ObjectMeta

__all__ = [
    "S3Credential",
    "credential_of",
]


@dataclass(frozen=True, slots=True, repr=False)
class S3Credential:
    """S3 access from the `sedna.io/credential` annotation; the repr never shows the secret."""

    endpoint: str | None
    use_https: bool
    access_key_id: str | None
    secret_access_key: str | None

    def __repr__(self) -> str:
        secret = None if self.secret_access_key is None else "***"
        return (
            f"S3Credential(endpoint={self.endpoint!r}, use_https={self.use_https!r}, "
            f"access_key_id={self.access_key_id!r}, secret_access_key={secret!r})"
        )


class _CredentialWire(msgspec.Struct, frozen=True, kw_only=True):
    """The annotation's JSON as Sedna writes it (its own key spellings)."""

    endpoint: Annotated[str, msgspec.Meta(min_length=1)] | None = msgspec.field(
        default=None, name="s3-endpoint"
    )
    use_https: Literal["0", "1"] = msgspec.field(default="1", name="s3-usehttps")
    access_key_id: str | None = msgspec.field(default=None, name="ACCESS_KEY_ID")
    secret_access_key: str | None = msgspec.field(default=None, name="SECRET_ACCESS_KEY")


def credential_of(meta: ObjectMeta) -> S3Credential | None:
    """The S3 credential a resource names, or None to use the standard AWS chain.

    Error reasons name fields only, never values: this is where secrets pass by.
    """
    text = meta.annotations.get(CREDENTIAL_ANNOTATION)
    if text is None:
        return None
    path = f'$.metadata.annotations["{CREDENTIAL_ANNOTATION}"]'
    try:
        wire = msgspec.json.decode(text.encode("utf-8", "surrogatepass"), type=_CredentialWire)
    except msgspec.ValidationError as e:
        error = invalid(e, path)
        if error.path.endswith("s3-usehttps"):  # msgspec would quote the value; not here
            raise InvalidMessage('must be "0" or "1"', error.path) from None
        raise error from None
    except (msgspec.DecodeError, RecursionError):
        reason = "must be a JSON object of strings"
        raise InvalidMessage(reason, path, code="invalid_json") from None
    if (wire.access_key_id is None) != (wire.secret_access_key is None):
        raise InvalidMessage("ACCESS_KEY_ID and SECRET_ACCESS_KEY must be given together", path)
    return S3Credential(
        endpoint=wire.endpoint,
        use_https=wire.use_https == "1",
        access_key_id=wire.access_key_id,
        secret_access_key=wire.secret_access_key,
    )
