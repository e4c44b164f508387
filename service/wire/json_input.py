"""Bytes to a JSON object, within the caps: size, nesting, arrays and objects, values.

The caps are checked on the bytes before anything is parsed, in a few vectorised passes:
what parsing costs is mostly one allocation per array or object, so a message within the
caps parses in milliseconds, and a deeply nested one never reaches a recursive parser.
Integers beyond 64 bits, which the state store cannot hold, are refused after parsing.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from service.errors import InvalidMessage, RejectCode
from service.wire.base import encode
from service.wire.limits import MAX_CONTAINERS, MAX_NESTING_DEPTH, MAX_PAYLOAD_BYTES, MAX_VALUES

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
