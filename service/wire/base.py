"""What every wire type shares: the struct base and the JSON encoders.

A wire type is immutable, keyword-only, spelled camelCase on the wire (Sedna's Go JSON) and
leaves its defaults out when encoded.
"""

import msgspec


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
