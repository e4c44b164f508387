"""What every wire type and decoder shares: the struct base and the JSON encoders, the caps on
what an inbound message may hold, and bytes to a JSON object within those caps.

A wire type is immutable, keyword-only, spelled camelCase on the wire (Sedna's Go JSON) and
leaves its defaults out when encoded.

The caps are the ones every decoder enforces, and how much of a refused message its rejection
record carries. The whole message's caps (size, nesting, arrays and objects, values) are
checked on its bytes before anything is parsed (`check_shape`), in a few vectorised passes:
what parsing costs is mostly one allocation per array or object, so a message within the
caps parses in milliseconds, and a deeply nested one never reaches a recursive parser.
Integers beyond 64 bits, which the state store cannot hold, are refused after parsing. The
free-form fields' own caps are checked when they are reached.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from service.errors import InvalidMessage, RejectCode

__all__ = [
    "MAX_ANNOTATIONS_BYTES",
    "MAX_CONTAINERS",
    "MAX_METRIC_VALUES",
    "MAX_NESTING_DEPTH",
    "MAX_OWNER_INFO_BYTES",
    "MAX_OWNER_INFO_DEPTH",
    "MAX_PAYLOAD_BYTES",
    "MAX_RESULTS",
    "MAX_RESULT_DEPTH",
    "MAX_TEMPLATE_BYTES",
    "MAX_TEMPLATE_DEPTH",
    "MAX_URL_CHARS",
    "MAX_VALUES",
    "REJECTION_PAYLOAD_BYTES",
    "Shape",
    "canonical",
    "check_shape",
    "decode_json_object",
    "encode",
    "shape",
]


class Wire(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """Shared config: immutable, keyword-only, camelCase on the wire, defaults left out."""


_ENCODER = msgspec.json.Encoder()
_CANONICAL_ENCODER = msgspec.json.Encoder(order="sorted")


def encode(obj: object) -> bytes:
    """JSON bytes of any wire type (defaults omitted, camelCase names)."""
    return _ENCODER.encode(obj)


def canonical(obj: object) -> bytes:
    """JSON with sorted keys, for plain JSON values: equal values give equal bytes.

    Not for Structs: msgspec omits a default by identity, not equality, so two equal Structs
    can encode differently.
    """
    return _CANONICAL_ENCODER.encode(obj)


# Every inbound message, before it is parsed. What parsing costs is mostly one allocation per
# array or object (and the garbage collector's walks over them), then a little per value: the
# caps below keep the worst message under the size limit to milliseconds of CPU (bench
# figure 9: ~17 ms, where a 1 MiB report of 62-deep lists cost 0.5-1.3 s, twice).
MAX_PAYLOAD_BYTES = 1 << 20
MAX_NESTING_DEPTH = 64
#: Arrays and objects in one message (a Sedna job has about a hundred, a report a few).
MAX_CONTAINERS = 10_000
#: Values in one message, counted as the commas between them (a report with two models and
#: a few 1,000-number metric lists has a few thousand).
MAX_VALUES = 100_000
# Free-form fields, each within the message's caps and with caps of its own, because they are
# kept, stored or passed on to others.
#: A report's `ownerInfo`: forwarded upstream with every status of the job it reports.
MAX_OWNER_INFO_BYTES = 64 * 1024
MAX_OWNER_INFO_DEPTH = 8
#: A report's `results`: each a free-form object (a model is `{format, url, metrics}`).
MAX_RESULTS = 100
MAX_RESULT_DEPTH = 8
#: The numbers in one list of a result's `metrics` (name -> list of numbers).
MAX_METRIC_VALUES = 1000
#: A pod template (`trainSpec`, `evalSpec`, `deploySpec`): stored and passed on, never read.
MAX_TEMPLATE_BYTES = 256 * 1024
MAX_TEMPLATE_DEPTH = 32
#: A resource's annotations together, keys and values: Kubernetes's own limit.
MAX_ANNOTATIONS_BYTES = 256 * 1024
#: The head of a refused message its rejection record carries (base64).
REJECTION_PAYLOAD_BYTES = 4096
#: The longest path or URL (outputDir, dataset url, a model's url).
MAX_URL_CHARS = 4096
#: The longest worker name: a DNS-1123 subdomain.
MAX_WORKER_NAME_CHARS = 253
#: The most digits a round number has in a worker's name: an int64's (versions below 10**19).
MAX_VERSION_DIGITS = len(str(2**63 - 1))
#: What a job's worker names add to the job's name: `lifelong worker` names its workers
#: `{job}-train-{version}` and `{job}-eval-{version}`, an inference worker is named
#: `{job}-inference-{suffix}` (a suffix of at least one character). The longest decides.
WORKER_NAME_OVERHEAD = max(
    len("-train-") + MAX_VERSION_DIGITS,
    len("-eval-") + MAX_VERSION_DIGITS,
    len("-inference-") + 1,
)
#: The longest job name whose every worker name fits `MAX_WORKER_NAME_CHARS` (227): a
#: longer one could never hear a report, so it is refused when the job arrives.
MAX_JOB_NAME_CHARS = MAX_WORKER_NAME_CHARS - WORKER_NAME_OVERHEAD


_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
# +1 for an opening bracket, -1 for a closing one, 0 for any other byte
_BRACKET_DELTA = np.zeros(256, dtype=np.int8)
_BRACKET_DELTA[[ord("["), ord("{")]] = 1
_BRACKET_DELTA[[ord("]"), ord("}")]] = -1
_STRUCTURAL = np.zeros(256, dtype=bool)
_STRUCTURAL[[ord(c) for c in '"[]{},']] = True


@dataclass(frozen=True, slots=True)
class Shape:
    """What a JSON text holds outside its strings: the deepest nesting, how many arrays and
    objects, and how many commas (one fewer than the values, per array or object)."""

    depth: int
    containers: int
    commas: int


def shape(data: bytes, *, depth_bound: int = MAX_NESTING_DEPTH) -> Shape:
    """The shape of a JSON text, found without parsing it, in a few vectorised passes.

    Brackets and commas inside strings do not count (an escaped quote does not end a
    string). On text that is not JSON the figures are those of its longest valid prefix,
    which is as far as a parser gets before refusing it. A text
    with at most `depth_bound` brackets and at most `MAX_VALUES` commas is answered from
    two counts: upper bounds, and already within every cap that bound is compared with.
    """
    opened = data.count(b"[") + data.count(b"{")
    commas = data.count(b",")
    if opened <= depth_bound and commas <= MAX_VALUES:
        return Shape(depth=opened, containers=opened, commas=commas)
    if b"\\" in data:  # drop escaped backslashes, then escaped quotes: no quote is escaped
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    codes = np.frombuffer(data, dtype=np.uint8)
    marks = codes[_STRUCTURAL[codes]]  # quotes, brackets and commas, in order
    outside = (np.cumsum(marks == ord('"'), dtype=np.int32) & 1) == 0
    delta = _BRACKET_DELTA[marks] * outside
    depth = np.cumsum(delta, dtype=np.int32)
    return Shape(
        depth=int(depth.max(initial=0)),
        containers=int(np.count_nonzero(delta == 1)),
        commas=int(np.count_nonzero((marks == ord(",")) & outside)),
    )


def check_shape(data: bytes, path: str = "$") -> None:
    """Refuse a message over the size limit, nested too deeply, or holding more arrays,
    objects or values than `MAX_CONTAINERS` / `MAX_VALUES`, before it is parsed."""
    if len(data) > MAX_PAYLOAD_BYTES:
        raise InvalidMessage(
            f"payload too large: {len(data)} bytes > {MAX_PAYLOAD_BYTES}", path, code="too_large"
        )
    found = shape(data)
    if found.depth > MAX_NESTING_DEPTH:
        raise InvalidMessage(
            f"nesting deeper than {MAX_NESTING_DEPTH} levels", path, code="too_deep"
        )
    if found.containers > MAX_CONTAINERS:
        reason = f"more than {MAX_CONTAINERS} arrays and objects ({found.containers})"
        raise InvalidMessage(reason, path, code="too_many")
    if found.commas > MAX_VALUES:
        raise InvalidMessage(f"more than {MAX_VALUES} values", path, code="too_many")


def check_free_form(
    text: bytes | msgspec.Raw, path: str, max_bytes: int, max_depth: int, *, obj: bool = False
) -> None:
    """A free-form field's own caps: its encoded size and its nesting below the field."""
    raw = bytes(text)
    if obj and not raw.startswith(b"{"):
        raise InvalidMessage("Expected `object`", path)
    if len(raw) > max_bytes:
        reason = f"larger than {max_bytes} bytes ({len(raw)})"
        raise InvalidMessage(reason, path, code="too_large")
    if shape(raw, depth_bound=max_depth).depth > max_depth:
        raise InvalidMessage(f"nesting deeper than {max_depth} levels", path, code="too_deep")


def decode_json_object(data: bytes, path: str = "$") -> dict[str, Any]:
    """Parse bytes into a JSON object, refusing oversize, too deeply nested or too crowded
    input (`check_shape`) before parsing: msgspec would raise RecursionError on deep
    nesting, and code walking the result could too."""
    data = bytes(data)
    check_shape(data, path)
    try:
        obj = msgspec.json.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        raise not_json(e, path) from None
    if not isinstance(obj, dict):
        raise InvalidMessage(
            f"expected a JSON object, got {json_type(obj)}", path, code="invalid_json"
        )
    return obj


def not_json(error: Exception, path: str) -> InvalidMessage:
    code: RejectCode = "invalid_utf8" if "utf-8" in str(error).lower() else "invalid_json"
    return InvalidMessage(f"not valid JSON: {error}", path, code=code)


def check_integers(obj: object, path: str = "$") -> None:
    """Refuse integers beyond 64 bits: msgpack, which the state store may use, cannot hold
    them, and a resource that cannot be stored must not get past the door.

    A value without a run of 19 digits in its JSON text holds no such integer (2**63 has 19
    digits); that search costs a millisecond per MiB where a walk costs a hundred. Only a
    message that holds a long number pays for the walk, and only one holding a big integer
    for the paths."""
    digits = encode(obj).translate(_DIGITS_AS_ZERO)
    if digits.find(b"0" * 19) < 0 or not _has_big_integer(obj):
        return
    for value, where in _walk(obj, path):
        if isinstance(value, int) and not _INT64_MIN <= value <= _UINT64_MAX:
            raise InvalidMessage("integer out of 64-bit range", where)


def _has_big_integer(obj: object) -> bool:
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, int) and not _INT64_MIN <= value <= _UINT64_MAX:
            return True
    return False


def _walk(obj: object, path: str) -> Iterator[tuple[object, str]]:
    """Every value with its path, iteratively (depth is bounded, but recursion is not needed)."""
    stack: list[tuple[object, str]] = [(obj, path)]
    while stack:
        value, where = stack.pop()
        yield value, where
        if isinstance(value, dict):
            stack.extend((v, f"{where}.{k}") for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(value))


def json_type(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")
