"""Worker reports: Sedna's worker message, the models it may carry, and its decoder.

A report is decoded leniently where a strict decoder would strand a job (results that are
not objects are dropped) and strictly where its content is kept or passed on (`ownerInfo`
and each result within their own caps).
"""

from typing import Any

import msgspec

from service.errors import InvalidMessage
from service.wire.base import (
    MAX_METRIC_VALUES,
    MAX_OWNER_INFO_BYTES,
    MAX_OWNER_INFO_DEPTH,
    MAX_PAYLOAD_BYTES,
    MAX_RESULT_DEPTH,
    MAX_RESULTS,
    Wire,
    check_free_form,
    check_integers,
    check_shape,
    not_json,
)
from service.wire.fields import (
    DnsLabel,
    DnsSubdomain,
    JsonObject,
    OwnerKind,
    WorkerKind,
    WorkerStatus,
    invalid,
)

__all__ = [
    "STATUS_OPTIONAL_KIND",
    "Model",
    "WorkerMessage",
    "decode_worker_message",
]


class Model(Wire, frozen=True, kw_only=True):
    """One model a worker reports; only built from results that pass `usable_models`."""

    format: str = ""
    url: str
    metrics: dict[str, Any] | None = None
    devices: list[str] = []


#: The owner kind whose reports may leave `status` out: Sedna's joint-inference worker
#: library reports its inference counts without one.
STATUS_OPTIONAL_KIND = "jointinferenceservice"
STATUS_REQUIRED = (
    "required: only a joint-inference service's worker may report without a status "
    "(ready, running, completed or failed)"
)


class WorkerMessage(Wire, frozen=True, kw_only=True):
    """Sedna's worker report; `results` stays raw so a malformed one cannot fail decoding,
    and `ownerInfo` may be null (a Go nil map), which reads as empty. `status` is required
    except of a joint-inference service's worker (None: it gave none)."""

    name: DnsSubdomain
    namespace: DnsLabel
    owner_name: DnsSubdomain
    owner_kind: OwnerKind
    owner_info: JsonObject | None = None
    kind: WorkerKind
    status: WorkerStatus | None = None
    results: list[dict[str, Any]] = []


_JSON_NULL = msgspec.Raw(b"null")


class _WorkerWire(Wire, frozen=True, kw_only=True):
    """What `decode_worker_message` parses: the free-form fields kept as text until their
    caps are checked (`ownerInfo` for good)."""

    name: DnsSubdomain
    namespace: DnsLabel
    owner_name: DnsSubdomain
    owner_kind: OwnerKind
    owner_info: msgspec.Raw = _JSON_NULL
    kind: WorkerKind
    status: WorkerStatus | None = None
    results: msgspec.Raw = _JSON_NULL


def decode_worker_message(data: bytes) -> WorkerMessage:
    """Decode and validate a worker report; `ownerKind` comes back lower-cased; `status`
    may be absent from a joint-inference worker's report only.

    `results` and `ownerInfo` of null (a Go nil) read as empty, and results that are not
    objects are dropped: a malformed report must still move the job on ("no usable model"),
    not be refused and leave the job waiting for a worker that has finished. The message is
    parsed once, straight into its type: `ownerInfo` is checked (an object, within its caps)
    and kept as its JSON text, never turned into Python values.
    """
    data = bytes(data)
    check_shape(data)
    try:
        wire = msgspec.json.decode(data, type=_WorkerWire)
    except msgspec.ValidationError as e:
        raise invalid(e) from None
    except (msgspec.DecodeError, RecursionError) as e:
        raise not_json(e, "$") from None
    owner_kind = wire.owner_kind.lower()
    if wire.status is None and owner_kind != STATUS_OPTIONAL_KIND:
        raise InvalidMessage(STATUS_REQUIRED, "$.status")
    owner_info: msgspec.Raw | None = wire.owner_info
    if bytes(wire.owner_info) == b"null":
        owner_info = None
    else:
        check_free_form(
            wire.owner_info, "$.ownerInfo", MAX_OWNER_INFO_BYTES, MAX_OWNER_INFO_DEPTH, obj=True
        )
    results = []
    if bytes(wire.results).startswith(b"["):  # anything else: no results, as a Go nil
        results = _results(msgspec.json.decode(wire.results, type=list[msgspec.Raw]))
    return WorkerMessage(
        name=wire.name,
        namespace=wire.namespace,
        owner_name=wire.owner_name,
        owner_kind=owner_kind,
        owner_info=owner_info,
        kind=wire.kind,
        status=wire.status,
        results=results,
    )


def _results(raw: list[msgspec.Raw]) -> list[dict[str, Any]]:
    """The results that are objects, each within its caps."""
    if len(raw) > MAX_RESULTS:
        reason = f"more than {MAX_RESULTS} results ({len(raw)})"
        raise InvalidMessage(reason, "$.results", code="too_many")
    results = []
    for i, text in enumerate(raw):
        path = f"$.results[{i}]"
        check_free_form(text, path, MAX_PAYLOAD_BYTES, MAX_RESULT_DEPTH)
        result = msgspec.json.decode(text)
        if not isinstance(result, dict):
            continue
        check_integers(result, path)
        metrics = result.get("metrics")
        if isinstance(metrics, dict):
            for name, values in metrics.items():
                if isinstance(values, list) and len(values) > MAX_METRIC_VALUES:
                    reason = f"more than {MAX_METRIC_VALUES} numbers ({len(values)})"
                    raise InvalidMessage(reason, f"{path}.metrics.{name}", code="too_many")
        results.append(result)
    return results
